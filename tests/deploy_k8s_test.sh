#!/usr/bin/env bash
# deploy/k8s without a cluster (`kubectl apply --dry-run=client` needs an API server for
# discovery, so it cannot run here):
# - `kubectl kustomize` renders overlays/cpu and overlays/gpu (works with Debian's kubectl
#   1.20 / kustomize v2.0.3 and with kubectl >= 1.27 / kustomize v5);
# - yamllint on every manifest;
# - structure of the rendered objects (deploy/check_deploy.py k8s): apiVersion/kind/name,
#   StatefulSet behind a headless Service with matching selectors, shard index from the
#   pod-index label, Indexed Job (rank = completion index, no --rank, at most 3 retries),
#   replicas = NUM_SHARDS, completions = parallelism = NUM_WORKERS, --ps expands to every
#   shard's DNS name in order, every $(VAR) in args is defined, fixed port = containerPort =
#   Service port, cpu/memory requests <= limits, nvidia.com/gpu and the CUDA image only in
#   the gpu overlay; security on: --tls_cert/--tls_key/--tls_ca/--job_token_file from a
#   Secret mounted read-only and readable by the pod's user, the pod's own certificate
#   (ps-$(SHARD), worker-$(JOB_COMPLETION_INDEX)), readiness/liveness probes that exec
#   health_probe on the served port with the same files;
# - mutated renderings fail: 3 replicas for 2 shards, every shard with shard 0's
#   certificate, a Secret only its owner (root) can read.
# Not checked: field names and types against the Kubernetes OpenAPI schema, admission.
source "$(dirname "$0")/testlib.sh"
CHECK="$ROOT/deploy/check_deploy.py"
K8S="$SCRATCH/k8s"
export HOME="$SCRATCH"
# kustomize does not follow the runfiles' symlinks: work on a real copy.
rm -rf "$SCRATCH/k8s" && cp -rL "$ROOT/deploy/k8s" "$SCRATCH/k8s"

python3 -c 'import yaml' 2>/dev/null || die "python3-yaml missing (run tools/setup.sh)"
if command -v yamllint >/dev/null; then
  yamllint -s -d '{extends: default, rules: {line-length: {max: 100}, document-start: disable}}' \
    "$K8S" || die "yamllint"
fi
for overlay in cpu gpu; do
  out="$SCRATCH/$overlay.yaml"
  if command -v kubectl >/dev/null; then
    kubectl kustomize "$K8S/overlays/$overlay" >"$out" 2>"$SCRATCH/kustomize.err" \
      || die "kubectl kustomize overlays/$overlay: $(cat "$SCRATCH/kustomize.err")"
    echo "rendered overlays/$overlay with kubectl $(kubectl version --client 2>/dev/null | grep -o 'v[0-9][0-9.]*' | head -n 1)"
  elif [[ $overlay == cpu ]]; then
    echo "note: no kubectl (tools/setup.sh installs kubernetes-client): checking base/ as is"
    for f in "$K8S"/base/*.yaml; do
      [[ $(basename "$f") == kustomization.yaml ]] && continue
      cat "$f"
      echo "---"
    done >"$out"
  else
    continue
  fi
  python3 "$CHECK" k8s --overlay="$overlay" "$out" || die "overlays/$overlay: structural checks"
done
# Every manifest in base/ is listed in its kustomization.
for f in "$K8S"/base/*.yaml; do
  name=$(basename "$f")
  [[ $name == kustomization.yaml ]] && continue
  grep -q "^  - $name\$" "$K8S/base/kustomization.yaml" || die "base/$name is not in kustomization"
done

sed 's/^  replicas: 2$/  replicas: 3/' "$SCRATCH/cpu.yaml" >"$SCRATCH/bad.yaml"
if python3 "$CHECK" k8s --overlay=cpu "$SCRATCH/bad.yaml" >"$SCRATCH/bad.txt"; then
  die "3 replicas for NUM_SHARDS=2 passed"
fi
grep -q "replicas 3 != NUM_SHARDS 2" "$SCRATCH/bad.txt" || die "$(cat "$SCRATCH/bad.txt")"
echo "mutation caught: StatefulSet replicas != NUM_SHARDS"

# Checkpoints on an emptyDir (dies with the pod) instead of the claim template.
python3 - "$SCRATCH/cpu.yaml" "$SCRATCH/bad2.yaml" <<'PY'
import sys, yaml
docs = list(yaml.safe_load_all(open(sys.argv[1])))
for d in docs:
    if d and d.get("kind") == "StatefulSet":
        d["spec"].pop("volumeClaimTemplates", None)
        d["spec"]["template"]["spec"]["volumes"] = [{"name": "checkpoints", "emptyDir": {}}]
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
if python3 "$CHECK" k8s --overlay=cpu "$SCRATCH/bad2.yaml" >"$SCRATCH/bad2.txt"; then
  die "checkpoints on an emptyDir passed"
fi
grep -q "not a volumeClaimTemplate" "$SCRATCH/bad2.txt" || die "$(cat "$SCRATCH/bad2.txt")"
echo "mutation caught: checkpoints on a volume that dies with the pod"

# mutate PATTERN SED_SCRIPT DESCRIPTION: the checker must fail on the mutated copy, saying PATTERN.
mutate() {
  sed "$2" "$SCRATCH/cpu.yaml" >"$SCRATCH/bad.yaml"
  if python3 "$CHECK" k8s --overlay=cpu "$SCRATCH/bad.yaml" >"$SCRATCH/bad.txt"; then die "$3 passed"; fi
  grep -qF -- "$1" "$SCRATCH/bad.txt" || die "$3: $(cat "$SCRATCH/bad.txt")"
  echo "mutation caught: $3"
}
mutate 'expected ps-$(SHARD).crt (this pod'"'"'s own)' 's/ps-\$(SHARD)\.crt/ps-0.crt/' \
  "every shard presents shard 0's certificate"
mutate "cannot read Secret dptrain-ps-tls" 's/defaultMode: \(288\|0440\)$/defaultMode: 0400/' \
  "a Secret the pod's user cannot read"
echo PASS
