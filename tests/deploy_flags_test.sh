#!/usr/bin/env bash
# Every flag that deploy/docker-compose.yml and the Kubernetes manifests (both overlays) pass
# to ps_server, gpu_worker and health_probe exists in that binary's --helpfull, so the deploy
# files cannot drift from the code. Also: a flag the binaries lack is caught.
source "$(dirname "$0")/testlib.sh"
CHECK="$ROOT/deploy/check_deploy.py"
HEALTH_PROBE="$ROOT/deploy/health_probe"
export HOME="$SCRATCH"
# kustomize does not follow the runfiles' symlinks: work on a real copy.
rm -rf "$SCRATCH/k8s" && cp -rL "$ROOT/deploy/k8s" "$SCRATCH/k8s"
python3 -c 'import yaml' 2>/dev/null || die "python3-yaml missing (run tools/setup.sh)"

files=("$ROOT/deploy/docker-compose.yml")
if command -v kubectl >/dev/null; then
  for overlay in cpu gpu; do
    kubectl kustomize "$SCRATCH/k8s/overlays/$overlay" >"$SCRATCH/$overlay.yaml" 2>/dev/null \
      || die "kubectl kustomize overlays/$overlay"
    files+=("$SCRATCH/$overlay.yaml")
  done
else
  echo "note: no kubectl; reading deploy/k8s/base and the overlays' patches directly"
  files+=("$SCRATCH"/k8s/base/*.yaml "$SCRATCH"/k8s/overlays/*/*.yaml)
fi

# --helpfull lists each flag as "    --name (help); default: ...".
known() { { "$1" --helpfull 2>&1 || true; } | sed -n 's/^    --\([A-Za-z0-9_]*\) .*/\1/p' | sort -u; }
known "$PS_SERVER" >"$SCRATCH/ps_server.flags"
known "$GPU_WORKER" >"$SCRATCH/gpu_worker.flags"
known "$HEALTH_PROBE" >"$SCRATCH/health_probe.flags"
for b in ps_server gpu_worker health_probe; do
  [[ -s "$SCRATCH/$b.flags" ]] || die "no flags read from $b --helpfull"
done

check_used() {  # check_used FILE...: every used flag is known
  python3 "$CHECK" flags "$@" >"$SCRATCH/used.txt" || { cat "$SCRATCH/used.txt"; return 1; }
  local bad=0 binary flag where
  while read -r binary flag where; do
    if ! grep -qx -- "${flag#--}" "$SCRATCH/$binary.flags"; then
      echo "FAIL: $where passes $flag, which $binary does not define"
      bad=1
    fi
  done <"$SCRATCH/used.txt"
  return $bad
}

check_used "${files[@]}" || die "deploy files pass unknown flags"
awk '{print $1, $2}' "$SCRATCH/used.txt" | sort -u | awk '{a[$1] = a[$1] " " $2} END {
  for (b in a) print b ":" a[b] }' | sort
echo "$(wc -l <"$SCRATCH/used.txt") flag uses in ${#files[@]} files, all defined"

sed 's/--epochs=5/--num_epochs=5/' "$ROOT/deploy/docker-compose.yml" >"$SCRATCH/bad.yml"
if check_used "$SCRATCH/bad.yml" >"$SCRATCH/bad.txt"; then die "--num_epochs passed"; fi
grep -q "passes --num_epochs, which gpu_worker does not define" "$SCRATCH/bad.txt" \
  || die "$(cat "$SCRATCH/bad.txt")"
echo "mutation caught: unknown flag --num_epochs"
echo PASS
