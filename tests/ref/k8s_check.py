#!/usr/bin/python3
"""Whether Kubernetes manifests for lora-stack behind the llm-d router would be accepted: the
InferencePool by its CRD, the endpoint picker's configuration by the picker's strict loader, and
the picker's Deployment wired to both. Written for the tests, from the reference files in
tests/ref/llm-d-router/ (see its README) and not from the manifests it checks.

    k8s_check.py [--ref DIR] FILE...

FILE holds one or more YAML documents; all files are checked as one set, as `kubectl apply -f`
on each of them would create it. One line per problem on standard output, "FILE: problem".
Exit 0 when there is none, 1 when there are problems, 100 on usage errors, 111 when the
reference files cannot be read.

What is checked:
  - every InferencePool against the openAPIV3Schema of its version in the CRD, with unknown
    fields refused (kubectl's strict field validation) and the CRD's validation rules;
  - every EndpointPickerConfig (a ConfigMap entry with that kind, or the one the picker's
    --config-file reads): apiVersion, kind and every top-level key as the router's samples have
    them; every plugin type in the samples (or among the types the loader adds by default, with
    their parameter keys); unique plugin names; every pluginRef naming a declared plugin; every
    weight a number; only the keys each entry's type decodes;
  - the picker's Deployment: --config-file is a file of a mounted ConfigMap that exists here,
    --pool-name an InferencePool here; the pool's endpointPickerRef a Service here that selects
    the picker's pods on its gRPC port; the pool's selector some Deployment's pods, and its target
    ports their container ports; an HTTPRoute's InferencePool backends pools here.
"""

import os
import re
import sys

import jsonschema
import yaml

REF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llm-d-router")
SAMPLES = ("epp-config.yaml", "default-config.yaml", "datalayer-config.yaml")
CRD = "inferencepools-crd.yaml"
UNDECLARED = "undeclared-plugin-types.txt"

# The keys each nested entry of an EndpointPickerConfig decodes into
# (apix/config/v1alpha1/endpointpickerconfig_types.go); strict decoding refuses any other.
ENTRY_KEYS = {
    "plugin": {"name", "type", "parameters"},
    "profile": {"name", "plugins"},
    "profile plugin": {"pluginRef", "weight"},
    "source": {"pluginRef", "extractors"},
    "extractor": {"pluginRef"},
    "parser": {"pluginRef"},
}
DEFAULT_GRPC_PORT = 9002  # the picker's --grpc-port when not given


class Problems:
    def __init__(self):
        self.lines = []

    def add(self, where, msg):
        self.lines.append("%s: %s" % (where, msg))


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# --- the reference ----------------------------------------------------------------------------


class Reference:
    def __init__(self, ref_dir):
        self.api_versions, self.kinds, self.top_keys, self.types = set(), set(), set(), set()
        for name in SAMPLES:
            for d in load_docs(os.path.join(ref_dir, name)):
                self.api_versions.add(d.get("apiVersion"))
                self.kinds.add(d.get("kind"))
                self.top_keys.update(d.keys())
                self.types.update(p["type"] for p in d.get("plugins", []))
        # type -> the parameter keys it decodes, for the types the samples leave to the loader.
        self.undeclared = {}
        with open(os.path.join(ref_dir, UNDECLARED), encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if words and not words[0].startswith("#"):
                    self.undeclared[words[0]] = set(words[1:])
        crd = load_docs(os.path.join(ref_dir, CRD))[0]
        self.pool_group = crd["spec"]["group"]
        self.pool_versions = {v["name"]: v["schema"]["openAPIV3Schema"]
                              for v in crd["spec"]["versions"] if v.get("served")}


# --- InferencePool -----------------------------------------------------------------------------


def closed(schema):
    """The schema with unknown fields refused wherever it names its properties, as the API server
    does for a structural schema under strict field validation."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def cel_rules(schema, at=()):
    """(path, rule, message) for every x-kubernetes-validations rule in the schema."""
    if isinstance(schema, dict):
        for r in schema.get("x-kubernetes-validations", []):
            yield at, r["rule"], r.get("message", r["rule"])
        for k, v in schema.get("properties", {}).items():
            yield from cel_rules(v, at + (k,))
        if isinstance(schema.get("items"), dict):
            yield from cel_rules(schema["items"], at + ("[]",))


def values_at(doc, path):
    """The values at path in doc ("[]" steps into every item of a list)."""
    if not path:
        yield doc
        return
    step, rest = path[0], path[1:]
    if step == "[]":
        for item in doc if isinstance(doc, list) else []:
            yield from values_at(item, rest)
    elif isinstance(doc, dict) and step in doc:
        yield from values_at(doc[step], rest)


# The CRD's rules, each as this checker evaluates it. A rule not here fails the check, so that a
# newer CRD cannot pass with its rules unread.
CEL = {
    "self.kind != 'Service' || has(self.port)":
        lambda v: v.get("kind", "Service") != "Service" or "port" in v,
    "self.all(p1, self.exists_one(p2, p1.number==p2.number))":
        lambda v: len({p.get("number") for p in v}) == len(v),
}


def check_pool(where, doc, ref, out):
    api = str(doc.get("apiVersion", ""))
    group, _, version = api.rpartition("/")
    if group != ref.pool_group:
        out.add(where, "InferencePool apiVersion '%s': the CRD's group is %s"
                % (api, ref.pool_group))
    if group != ref.pool_group or version not in ref.pool_versions:
        # Checked against the newest served version all the same, to name the fields to change.
        newest = sorted(ref.pool_versions)[-1]
        out.add(where, "InferencePool apiVersion '%s': the CRD serves no version %s (it has %s;"
                " checked against %s)" % (api, version, ", ".join(sorted(ref.pool_versions)),
                                          newest))
        version = newest
    schema = ref.pool_versions[version]
    validator = jsonschema.Draft7Validator(closed(schema))
    for e in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in e.absolute_path) or "(document)"
        out.add(where, "InferencePool %s: %s" % (path, e.message))
    for path, rule, message in cel_rules(schema):
        check = CEL.get(rule)
        if check is None:
            out.add(where, "the CRD has a validation rule this checker cannot evaluate: %s" % rule)
            continue
        for v in values_at(doc, path):
            if not check(v):
                out.add(where, "InferencePool %s: %s" % (".".join(path), message))
    if not (doc.get("metadata") or {}).get("name"):
        out.add(where, "InferencePool without metadata.name")


# --- EndpointPickerConfig ----------------------------------------------------------------------


def unknown_keys(where, what, entry, out):
    if not isinstance(entry, dict):
        out.add(where, "%s is not a mapping: %r" % (what, entry))
        return False
    for k in sorted(set(entry) - ENTRY_KEYS[what]):
        out.add(where, "%s has the key '%s', which the picker does not decode" % (what, k))
    return True


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_refs(where, what, entries, declared, out):
    for e in entries or []:
        if unknown_keys(where, what, e, out):
            ref = e.get("pluginRef")
            if ref not in declared:
                out.add(where, "%s pluginRef '%s' names no declared plugin" % (what, ref))


def check_picker_config(where, cfg, ref, out):
    if not isinstance(cfg, dict):
        out.add(where, "the picker's configuration is not a mapping")
        return
    if cfg.get("apiVersion") not in ref.api_versions:
        out.add(where, "apiVersion %r is none the router's samples use (%s)"
                % (cfg.get("apiVersion"), ", ".join(sorted(ref.api_versions))))
    if cfg.get("kind") not in ref.kinds:
        out.add(where, "kind %r is not %s" % (cfg.get("kind"), ", ".join(sorted(ref.kinds))))
    for k in sorted(set(cfg) - ref.top_keys):
        out.add(where, "top-level key '%s' is in none of the router's samples" % k)

    declared = set()
    for p in cfg.get("plugins") or []:
        if not unknown_keys(where, "plugin", p, out):
            continue
        t = p.get("type")
        if t in ref.undeclared:
            for k in sorted(set(p.get("parameters") or {}) - ref.undeclared[t]):
                out.add(where, "plugin type '%s' has no parameter '%s'" % (t, k))
        elif t not in ref.types:
            out.add(where, "plugin type %r is in none of the router's samples" % t)
        if "parameters" in p and not isinstance(p["parameters"], dict):
            out.add(where, "plugin %r: parameters is not a mapping" % t)
        name = p.get("name", t)
        if name in declared:
            out.add(where, "plugin name '%s' is declared twice" % name)
        declared.add(name)
    if not declared:
        out.add(where, "no plugins")

    profiles = cfg.get("schedulingProfiles") or []
    if not profiles:
        out.add(where, "no schedulingProfiles")
    names = set()
    for prof in profiles:
        if not unknown_keys(where, "profile", prof, out):
            continue
        if not prof.get("name") or prof.get("name") in names:
            out.add(where, "profile name %r is missing or taken" % prof.get("name"))
        names.add(prof.get("name"))
        check_refs(where, "profile plugin", prof.get("plugins"), declared, out)
        for e in prof.get("plugins") or []:
            if isinstance(e, dict) and "weight" in e and not is_number(e["weight"]):
                out.add(where, "profile '%s': the weight of '%s' is not a number: %r"
                        % (prof.get("name"), e.get("pluginRef"), e["weight"]))

    dl = cfg.get("dataLayer") or {}
    for s in dl.get("sources") or []:
        check_refs(where, "source", [s], declared, out)
        if isinstance(s, dict):
            check_refs(where, "extractor", s.get("extractors"), declared, out)
    check_refs(where, "parser", (cfg.get("requestHandler") or {}).get("parsers"), declared, out)


# --- wiring ------------------------------------------------------------------------------------


def flag(args, name):
    """The value of --name in an argument list (--name=V or --name V), else None."""
    for i, a in enumerate(args):
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
        if a == "--" + name and i + 1 < len(args):
            return args[i + 1]
    return None


def containers(deploy):
    return ((deploy.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "containers") or []


def pod_labels(deploy):
    return (((deploy.get("spec") or {}).get("template") or {}).get("metadata") or {}).get(
        "labels") or {}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def config_of(where, deploy, c, path, docs, out):
    """The text of the ConfigMap entry mounted at path in container c, or None."""
    volumes = {v.get("name"): v for v in deploy["spec"]["template"]["spec"].get("volumes") or []}
    for m in c.get("volumeMounts") or []:
        mount = m.get("mountPath", "").rstrip("/")
        if m.get("subPath"):
            if path != mount:
                continue
            key = m["subPath"]
        elif os.path.dirname(path) == mount:
            key = os.path.basename(path)
        else:
            continue
        cm_name = ((volumes.get(m.get("name")) or {}).get("configMap") or {}).get("name")
        if not cm_name:
            out.add(where, "--config-file %s: volume '%s' is not a ConfigMap"
                    % (path, m.get("name")))
            return None
        cms = [d for _, d in docs if d.get("kind") == "ConfigMap"
               and d["metadata"].get("name") == cm_name]
        if not cms:
            out.add(where, "--config-file %s: no ConfigMap '%s' here" % (path, cm_name))
            return None
        text = (cms[0].get("data") or {}).get(key)
        if text is None:
            out.add(where, "--config-file %s: ConfigMap '%s' has no key '%s'"
                    % (path, cm_name, key))
        return text
    out.add(where, "--config-file %s is under no volume mount of the container" % path)
    return None


def check_set(docs, ref, out):
    by_kind = {}
    for where, d in docs:
        by_kind.setdefault(d.get("kind"), []).append((where, d))
    pools = by_kind.get("InferencePool", [])
    deploys = by_kind.get("Deployment", [])
    services = by_kind.get("Service", [])

    for where, pool in pools:
        check_pool(where, pool, ref, out)

    # The picker's configurations: the entry its --config-file reads, and any entry of kind
    # EndpointPickerConfig.
    configs = {}
    pickers = []
    for where, d in deploys:
        for c in containers(d):
            path = flag(c.get("args") or [], "config-file")
            if path is None:
                continue
            pickers.append((where, d, c))
            text = config_of(where, d, c, path, docs, out)
            if text is not None:
                configs[id(text)] = ("%s (--config-file %s)" % (where, path), text)
    for where, d in by_kind.get("ConfigMap", []):
        for key, text in (d.get("data") or {}).items():
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError as e:
                out.add(where, "ConfigMap entry '%s' is not YAML: %s" % (key, e))
                continue
            if isinstance(parsed, dict) and parsed.get("kind") == "EndpointPickerConfig":
                configs.setdefault(id(text), ("%s (%s)" % (where, key), text))
    if not pickers:
        out.add("(all files)", "no Deployment runs the endpoint picker with --config-file")
    if not configs:
        out.add("(all files)", "no EndpointPickerConfig")
        # Whatever a ConfigMap holds is then checked as one, to say what the picker would refuse.
        for where, d in by_kind.get("ConfigMap", []):
            for key, text in (d.get("data") or {}).items():
                configs[id(text)] = ("%s (%s)" % (where, key), text)
    for where, text in configs.values():
        try:
            check_picker_config(where, yaml.safe_load(text), ref, out)
        except yaml.YAMLError as e:
            out.add(where, "not YAML: %s" % e)
    if not pools:
        out.add("(all files)", "no InferencePool")

    for where, d, c in pickers:
        args = c.get("args") or []
        pool_name = flag(args, "pool-name")
        match = [p for _, p in pools if p["metadata"].get("name") == pool_name]
        if not match:
            out.add(where, "--pool-name %r names no InferencePool here" % pool_name)
            continue
        grpc = int(flag(args, "grpc-port") or DEFAULT_GRPC_PORT)
        epp = match[0].get("spec", {}).get("endpointPickerRef") or {}
        svc = [s for _, s in services if s["metadata"].get("name") == epp.get("name")]
        if not svc:
            out.add(where, "endpointPickerRef names no Service here: %r" % epp.get("name"))
            continue
        spec = svc[0].get("spec") or {}
        if not selects(spec.get("selector"), pod_labels(d)):
            out.add(where, "Service '%s' does not select the picker's pods" % epp.get("name"))
        want = (epp.get("port") or {}).get("number")
        named = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
        ok = False
        for p in spec.get("ports") or []:
            target = p.get("targetPort", p.get("port"))
            target = named.get(target, target)
            ok = ok or (p.get("port") == want and target == grpc)
        if not ok:
            out.add(where, "Service '%s' has no port %r to the picker's gRPC port %d"
                    % (epp.get("name"), want, grpc))

    pool_names = {p["metadata"].get("name") for _, p in pools}
    for where, route in by_kind.get("HTTPRoute", []):
        for rule in (route.get("spec") or {}).get("rules") or []:
            for b in rule.get("backendRefs") or []:
                if b.get("kind") != "InferencePool":
                    continue
                if b.get("group") != ref.pool_group:
                    out.add(where, "backendRef to InferencePool '%s' has group %r, not %s"
                            % (b.get("name"), b.get("group"), ref.pool_group))
                if b.get("name") not in pool_names:
                    out.add(where, "backendRef names no InferencePool here: %r" % b.get("name"))

    for where, pool in pools:
        spec = pool.get("spec") or {}
        sel = (spec.get("selector") or {}).get("matchLabels")
        servers = [d for _, d in deploys if selects(sel, pod_labels(d))]
        if not servers:
            out.add(where, "the pool's selector %r matches no Deployment's pods here" % sel)
            continue
        ports = {p.get("containerPort") for d in servers for c in containers(d)
                 for p in c.get("ports") or []}
        for t in spec.get("targetPorts") or []:
            if isinstance(t, dict) and t.get("number") not in ports:
                out.add(where, "target port %r is no container port of the pool's pods"
                        % t.get("number"))


def usage(msg):
    sys.stderr.write("k8s_check: fatal: %s\n%s\n" % (msg, __doc__.split("\n\n")[1]))
    sys.exit(100)


def main(argv):
    ref_dir, files = REF, []
    i = 0
    while i < len(argv):
        if argv[i] == "--ref":
            if i + 1 >= len(argv):
                usage("--ref needs a directory")
            ref_dir, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("-"):
            usage("unknown option '%s'" % argv[i])
        files.append(argv[i])
        i += 1
    if not files:
        usage("no file")
    try:
        ref = Reference(ref_dir)
    except (OSError, KeyError, yaml.YAMLError) as e:
        sys.stderr.write("k8s_check: fatal: unable to read the reference in '%s': %s\n"
                         % (ref_dir, e))
        return 111
    out = Problems()
    docs = []
    for f in files:
        try:
            loaded = load_docs(f)
        except (OSError, yaml.YAMLError) as e:
            out.add(f, "unreadable: %s" % e)
            continue
        for n, d in enumerate(loaded):
            if not isinstance(d, dict) or not isinstance(d.get("metadata", {}), dict):
                out.add(f, "document %d is not a Kubernetes object" % (n + 1))
                continue
            d.setdefault("metadata", {})
            name = d["metadata"].get("name", "?")
            docs.append(("%s: %s/%s" % (f, d.get("kind"), name), d))
    check_set(docs, ref, out)
    for line in out.lines:
        print(re.sub(r"\s+", " ", line))
    return 1 if out.lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
