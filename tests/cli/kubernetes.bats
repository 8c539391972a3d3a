#!/usr/bin/env bats
# examples/kubernetes/: the files a user applies to put lora-stack behind the llm-d router pass
# tests/ref/k8s_check.py (the InferencePool against its CRD, the endpoint picker's configuration
# against the router's samples, and the wiring between them); and each kind of mistake the
# checker exists for, made in a copy, is refused with a line that names it.

load ../helpers
bats_require_minimum_version 1.5.0

K8S="$ROOT/examples/kubernetes"
CHECK="$PYTHON $ROOT/tests/ref/k8s_check.py"
FILES=(lora-stack.yaml lora-stack-inferencepool.yaml lora-stack-endpoint-picker-config.yaml
    lora-stack-endpoint-picker.yaml lora-stack-httproute.yaml)

setup() {
    T=$BATS_TEST_TMPDIR
    cp "${FILES[@]/#/$K8S/}" "$T/"
}

# broken WANT FILE SED-SCRIPT: the copy of FILE edited by SED-SCRIPT makes the check fail with a
# line containing WANT.
broken() {
    local want=$1 file=$2
    sed -i -e "$3" "$T/$file"
    if cmp -s "$T/$file" "$K8S/$file"; then
        echo "the edit '$3' changed nothing in $file" >&2
        return 1
    fi
    run $CHECK "${FILES[@]/#/$T/}"
    expect_status 1
    [[ "$output" == *"$want"* ]] ||
        { echo "expected a line with '$want', got: $output" >&2; return 1; }
    cp "$K8S/$file" "$T/$file"
}

@test "kubernetes: the example files are the five a user applies, one job each" {
    [ "$(ls "$K8S" | paste -sd ' ')" = "$(printf '%s\n' "${FILES[@]}" | sort | paste -sd ' ')" ]
    run "$PYTHON" -c 'import sys, yaml
for f in sys.argv[1:]:
    print(f.rsplit("/", 1)[1], " ".join(d["kind"] for d in yaml.safe_load_all(open(f))))' \
        "${FILES[@]/#/$K8S/}"
    expect_status 0
    [ "${lines[0]}" = "lora-stack.yaml Deployment Service PodMonitor" ]
    [ "${lines[1]}" = "lora-stack-inferencepool.yaml InferencePool" ]
    [ "${lines[2]}" = "lora-stack-endpoint-picker-config.yaml ConfigMap" ]
    [ "${lines[3]}" = \
        "lora-stack-endpoint-picker.yaml ServiceAccount Role RoleBinding Deployment Service" ]
    [ "${lines[4]}" = "lora-stack-httproute.yaml HTTPRoute" ]
}

@test "kubernetes: the pool, the picker's configuration and its Deployment pass the check" {
    run $CHECK "${FILES[@]/#/$K8S/}"
    expect_status 0
    [ -z "$output" ]
}

@test "kubernetes: the picker's configuration uses the data layer, the three scorers and a picker" {
    run "$PYTHON" -c 'import sys, yaml
cm = next(yaml.safe_load_all(open(sys.argv[1])))
cfg = yaml.safe_load(cm["data"]["epp-config.yaml"])
print(" ".join(sorted(p["type"] for p in cfg["plugins"])))
profile = cfg["schedulingProfiles"][0]["plugins"]
print(" ".join("%s=%s" % (e["pluginRef"], e.get("weight", "-")) for e in profile))' \
        "$K8S/lora-stack-endpoint-picker-config.yaml"
    expect_status 0
    [ "${lines[0]}" = "core-metrics-extractor kv-cache-utilization-scorer lora-affinity-scorer \
max-score-picker metrics-data-source queue-scorer single-profile-handler" ]
    [ "${lines[1]}" = \
        "lora-affinity-scorer=2 queue-scorer=1 kv-cache-utilization-scorer=1 max-score-picker=-" ]
}

@test "kubernetes: the picker scrapes /metrics on the port the model server serves the API on" {
    grep -q '^          path: /metrics$' "$K8S/lora-stack-endpoint-picker-config.yaml"
    grep -q -- '--port 8000' "$K8S/lora-stack.yaml"
    grep -q '^    - number: 8000$' "$K8S/lora-stack-inferencepool.yaml"
}

@test "kubernetes: the configuration the old example had is refused, naming each mistake" {
    cat > "$T/old.yaml" <<'EOF'
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferencePool
metadata:
  name: lora-stack
spec:
  targetPortNumber: 8000
  selector: {app: lora-stack}
  extensionRef:
    name: lora-stack-epp
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: lora-stack-epp
data:
  epp.yaml: |
    metricsPort: 9100
    scorers:
      - name: lora-affinity
        weight: 2
EOF
    run $CHECK "$T/old.yaml" "$T/lora-stack.yaml"
    expect_status 1
    [[ "$output" == *"the CRD serves no version v1alpha2 (it has v1"* ]]
    [[ "$output" == *"'targetPorts' is a required property"* ]]
    [[ "$output" == *"'extensionRef', 'targetPortNumber' were unexpected"* ]]
    [[ "$output" == *"no Deployment runs the endpoint picker with --config-file"* ]]
    [[ "$output" == *"top-level key 'metricsPort' is in none of the router's samples"* ]]
    [[ "$output" == *"top-level key 'scorers' is in none of the router's samples"* ]]
    [[ "$output" == *"kind None is not EndpointPickerConfig"* ]]
}

@test "kubernetes: a plugin type, key, reference or weight the picker would refuse is named" {
    local c=lora-stack-endpoint-picker-config.yaml
    broken "plugin type 'lora-affinity' is in none of the router's samples" $c \
        's/- type: lora-affinity-scorer/- type: lora-affinity/'
    broken "profile plugin pluginRef 'queue' names no declared plugin" $c \
        's/- pluginRef: queue-scorer/- pluginRef: queue/'
    broken "the weight of 'lora-affinity-scorer' is not a number: '2'" $c \
        's/weight: 2/weight: "2"/'
    broken "plugin type 'metrics-data-source' has no parameter 'port_number'" $c \
        's/path: \/metrics/port_number: 8000/'
    broken "profile plugin has the key 'score'" $c 's/weight: 1$/score: 1/'
    broken "top-level key 'metrics' is in none of the router's samples" $c \
        's/^    dataLayer:/    metrics:/'
    broken "apiVersion 'llm-d.ai/v1' is none the router's samples use" $c \
        's/apiVersion: llm-d.ai\/v1alpha1/apiVersion: llm-d.ai\/v1/'
    broken "plugin name 'queue-scorer' is declared twice" $c \
        's/- type: kv-cache-utilization-scorer/- type: queue-scorer/'
    broken "source pluginRef 'metrics' names no declared plugin" $c \
        's/- pluginRef: metrics-data-source/- pluginRef: metrics/'
}

@test "kubernetes: an InferencePool its CRD refuses is named" {
    local p=lora-stack-inferencepool.yaml
    broken "spec: 'targetPorts' is a required property" $p 's/targetPorts:/targetPortNumber:/'
    broken "spec.targetPorts: port number must be unique" $p \
        's/    - number: 8000/    - number: 8000\n    - number: 8000/'
    broken "spec.endpointPickerRef: port is required when kind is 'Service'" $p \
        '/^    port:$/,/^      number: 9002$/d'
    broken "spec.endpointPickerRef.failureMode: 'Sometimes' is not one of" $p \
        's/FailClose/Sometimes/'
    broken "spec.targetPorts.0.number: 70000 is greater than the maximum of 65535" $p \
        's/number: 8000/number: 70000/'
}

@test "kubernetes: the picker's Deployment, Service and pool must point at each other" {
    local e=lora-stack-endpoint-picker.yaml
    broken "ConfigMap 'lora-stack-epp-config' has no key 'config.yaml'" $e \
        's/--config-file=\/etc\/epp\/epp-config.yaml/--config-file=\/etc\/epp\/config.yaml/'
    broken "is under no volume mount of the container" $e \
        's/mountPath: \/etc\/epp,/mountPath: \/etc\/picker,/'
    broken "no ConfigMap 'epp-config' here" $e \
        's/configMap: {name: lora-stack-epp-config}/configMap: {name: epp-config}/'
    broken "--pool-name 'pool' names no InferencePool here" $e \
        's/--pool-name=lora-stack/--pool-name=pool/'
    broken "Service 'lora-stack-epp' has no port 9002 to the picker's gRPC port 9102" $e \
        's/--grpc-port=9002/--grpc-port=9102/'
    broken "Service 'lora-stack-epp' does not select the picker's pods" $e \
        's/selector: {app: lora-stack-epp}/selector: {app: epp}/'
    broken "target port 8000 is no container port of the pool's pods" lora-stack.yaml \
        's/containerPort: 8000/containerPort: 8080/'
    broken "backendRef names no InferencePool here: 'pool'" lora-stack-httproute.yaml \
        's/name: lora-stack$/name: pool/'
    broken "has group 'inference.networking.x-k8s.io'" lora-stack-httproute.yaml \
        's/group: inference.networking.k8s.io/group: inference.networking.x-k8s.io/'
    broken "matches no Deployment's pods here" lora-stack.yaml \
        's/^        app: lora-stack$/        app: server/'
}

@test "kubernetes: k8s_check.py usage errors exit 100" {
    run --separate-stderr $CHECK
    expect_status 100
    [[ "$stderr" == *"no file"* ]]
    run --separate-stderr $CHECK --bogus "$T/lora-stack.yaml"
    expect_status 100
    run --separate-stderr $CHECK --ref "$T/none" "$T/lora-stack.yaml"
    expect_status 111
}
