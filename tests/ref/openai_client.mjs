// The official OpenAI Node client against lora-frontend: completions, chat, streaming, models.
// Usage: node openai_client.mjs NODE_DEPS_DIR BASE_URL
import { createRequire } from "node:module";
import path from "node:path";

const [dir, baseURL] = process.argv.slice(2);
const require = createRequire(path.join(dir, "package.json"));
const OpenAI = require("openai").default ?? require("openai");
const client = new OpenAI({ baseURL, apiKey: "unused" });

function assert(cond, what) {
  if (!cond) throw new Error("failed: " + what);
}

const models = await client.models.list();
const ids = models.data.map((m) => m.id);
assert(ids.includes("a0"), "models lists a0: " + ids);
const base = ids[0];

const c = await client.completions.create({
  model: "a0", prompt: "Hello", max_tokens: 8, temperature: 0, ignore_eos: true,
});
assert(c.object === "text_completion" && c.choices[0].finish_reason === "length",
  "completion: " + JSON.stringify(c));
assert(c.usage.completion_tokens === 8, "usage");

const chat = await client.chat.completions.create({
  model: base, messages: [{ role: "user", content: "hi" }], max_tokens: 6, temperature: 0,
  ignore_eos: true,
});
assert(chat.choices[0].message.role === "assistant", "chat: " + JSON.stringify(chat));
const whole = chat.choices[0].message.content;

const s = await client.chat.completions.create({
  model: base, messages: [{ role: "user", content: "hi" }], max_tokens: 6, temperature: 0,
  ignore_eos: true, stream: true, stream_options: { include_usage: true },
});
let text = "", usage = null;
for await (const chunk of s) {
  if (chunk.choices.length) text += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
assert(text === whole, `streamed ${JSON.stringify(text)} != ${JSON.stringify(whole)}`);
assert(usage && usage.completion_tokens === 6, "stream usage");

const cs = await client.completions.create({
  model: "a0", prompt: "Hello", max_tokens: 8, temperature: 0, ignore_eos: true, stream: true,
});
let ctext = "";
for await (const chunk of cs) ctext += chunk.choices[0]?.text ?? "";
assert(ctext === c.choices[0].text, "completion stream equals the whole");

try {
  await client.completions.create({ model: "no-such", prompt: "x", max_tokens: 1 });
  assert(false, "unknown model must fail");
} catch (e) {
  assert(e.status === 404, "unknown model is 404: " + e);
}
console.log("all passed");
