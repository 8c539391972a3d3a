// The official OpenAI Node client against lora-frontend: completions, chat, streaming, models,
// and vLLM's fields (those implemented change the answer, those refused are 400 naming them).
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
// vLLM's own fields pass through the client as unknown properties (extra_body in Python).
const full = c.choices[0].text;
if (full.length >= 4) {
  const stop = full.slice(2, 4);
  const kept = await client.completions.create({
    model: "a0", prompt: "Hello", max_tokens: 8, temperature: 0, ignore_eos: true, stop: [stop],
    include_stop_str_in_output: true,
  });
  assert(kept.choices[0].text === full.slice(0, full.indexOf(stop) + stop.length),
    "include_stop_str_in_output: " + JSON.stringify(kept.choices[0]));
}
const allowed = [33, 44, 55];
const a = await client.completions.create({
  model: "a0", prompt: "Hello", max_tokens: 8, temperature: 1, seed: 3, ignore_eos: true,
  allowed_token_ids: allowed, return_token_ids: true, logprobs: 1, prompt_logprobs: 0,
  return_tokens_as_token_ids: true,
});
const ch = a.choices[0];
assert(ch.token_ids.length === 8 && ch.token_ids.every((t) => allowed.includes(t)),
  "allowed_token_ids: " + JSON.stringify(ch.token_ids));
assert(ch.logprobs.tokens.every((t, i) => t === "token_id:" + ch.token_ids[i]),
  "return_tokens_as_token_ids: " + JSON.stringify(ch.logprobs.tokens));
assert(ch.prompt_logprobs[0] === null && ch.prompt_logprobs.length === a.usage.prompt_tokens,
  "prompt_logprobs: " + JSON.stringify(ch.prompt_logprobs));
const entry = Object.values(ch.prompt_logprobs[1])[0];
assert(typeof entry.logprob === "number" && entry.rank >= 1 && "decoded_token" in entry,
  "prompt_logprobs entry: " + JSON.stringify(entry));
const t = await client.completions.create({
  model: "a0", prompt: "Hello world again", max_tokens: 2, truncate_prompt_tokens: 2,
});
assert(t.usage.prompt_tokens === 2, "truncate_prompt_tokens: " + JSON.stringify(t.usage));
const rf = await client.chat.completions.create({
  model: base, messages: [{ role: "user", content: "hi" }], max_tokens: 6, temperature: 0,
  ignore_eos: true, response_format: { type: "text" }, tool_choice: "none",
});
assert(rf.choices[0].message.content === whole, "response_format text");
for (const [body, param] of [
  [{ suffix: "!" }, "suffix"], [{ use_beam_search: true }, "use_beam_search"],
  [{ response_format: { type: "json_object" } }, "response_format"],
]) {
  try {
    await client.completions.create({ model: "a0", prompt: "x", max_tokens: 1, ...body });
    assert(false, param + " must be refused");
  } catch (e) {
    assert(e.status === 400 && e.param === param, param + " is 400 naming it: " + e);
  }
}
try {
  await client.chat.completions.create({
    model: base, messages: [{ role: "user", content: "hi" }], tool_choice: "required",
  });
  assert(false, "tool_choice required must be refused");
} catch (e) {
  assert(e.status === 400 && e.param === "tool_choice", "tool_choice is 400: " + e);
}
console.log("all passed");
