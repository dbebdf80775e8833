#!/usr/bin/env bash
# deploy/docker-compose.yml without a Docker engine:
# - `docker-compose config` (Debian's docker-compose, client only) validates it against the
#   Compose schema and renders it, with and without the gpu profile;
# - yamllint (long lines allowed up to 100);
# - structure (deploy/check_deploy.py compose): per job (default, gpu profile) the shards'
#   --shard are 0..S-1, --num_shards/--num_workers match the services, workers' --ps lists
#   the shards in order with their ports, ranks are 0..N-1, --world_size = N, one learning
#   rate, health_probe healthchecks, workers wait for healthy shards, no restart that masks
#   failures, one GPU reserved per worker in the gpu profile; security on: every process has
#   --tls_cert/--tls_key/--tls_ca/--job_token_file, each a secret under /run/secrets that is
#   the file tools/make_certs.sh writes for that process (ps-I, worker-R, ca.crt,
#   job_token), and every health check presents the same;
# - mutated copies fail: --num_shards=3 on one shard, a token that is not a mounted secret,
#   a worker that mounts another rank's certificate, a GPU worker that reserves every GPU.
source "$(dirname "$0")/testlib.sh"
CHECK="$ROOT/deploy/check_deploy.py"
COMPOSE="$ROOT/deploy/docker-compose.yml"
export HOME="$SCRATCH"  # docker-compose may want a writable home; no engine is contacted

python3 -c 'import yaml' 2>/dev/null || die "python3-yaml missing (run tools/setup.sh)"
if command -v docker-compose >/dev/null; then
  docker-compose -f "$COMPOSE" config -q || die "docker-compose config rejected the file"
  docker-compose -f "$COMPOSE" --profile gpu config >"$SCRATCH/rendered.yml" \
    || die "docker-compose --profile gpu config failed"
  # Services without a profile are what a plain `docker-compose up` starts.
  services=$(python3 -c 'import sys, yaml
s = yaml.safe_load(open(sys.argv[1]))["services"]
print(" ".join(sorted(n for n, v in s.items() if not v.get("profiles"))))' "$SCRATCH/rendered.yml")
  [[ "$services" == "ps-0 ps-1 worker-0 worker-1" ]] || die "default services: $services"
  echo "docker-compose $(docker-compose version --short): valid; default services: $services"
else
  echo "note: docker-compose not installed (tools/setup.sh installs it): structural checks only"
  cp "$COMPOSE" "$SCRATCH/rendered.yml"
fi
if command -v yamllint >/dev/null; then
  yamllint -s -d '{extends: default, rules: {line-length: {max: 100}, document-start: disable}}' \
    "$COMPOSE" || die "yamllint"
fi
python3 "$CHECK" compose "$SCRATCH/rendered.yml" || die "structural checks failed"

sed '0,/"--num_shards=2"/s//"--num_shards=3"/' "$SCRATCH/rendered.yml" >"$SCRATCH/bad.yml"
sed -i '0,/--num_shards=2/s//--num_shards=3/' "$SCRATCH/bad.yml"
if python3 "$CHECK" compose "$SCRATCH/bad.yml" >"$SCRATCH/bad.txt"; then
  die "a shard with --num_shards=3 passed"
fi
grep -q "num_shards=3, but the file has 2" "$SCRATCH/bad.txt" || die "$(cat "$SCRATCH/bad.txt")"
echo "mutation caught: inconsistent --num_shards"

# A shard that restarts without checkpoints on its volume would come back empty.
python3 - "$SCRATCH/rendered.yml" "$SCRATCH/bad2.yml" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
cmd = d["services"]["ps-1"]["command"]
d["services"]["ps-1"]["command"] = [a for a in cmd if not a.startswith("--checkpoint_dir")]
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
if python3 "$CHECK" compose "$SCRATCH/bad2.yml" >"$SCRATCH/bad2.txt"; then
  die "a restarting shard without --checkpoint_dir passed"
fi
grep -q "ps-1 restart .* without --checkpoint_dir" "$SCRATCH/bad2.txt" || die "$(cat "$SCRATCH/bad2.txt")"
echo "mutation caught: a restarting shard without checkpoints"

# mutate PATTERN SED_SCRIPT DESCRIPTION: the checker must fail on the mutated copy, saying PATTERN.
mutate() {
  sed "$2" "$SCRATCH/rendered.yml" >"$SCRATCH/bad.yml"
  if python3 "$CHECK" compose "$SCRATCH/bad.yml" >"$SCRATCH/bad.txt"; then die "$3 passed"; fi
  grep -qF -- "$1" "$SCRATCH/bad.txt" || die "$3: $(cat "$SCRATCH/bad.txt")"
  echo "mutation caught: $3"
}
mutate "--job_token_file=/tmp/token is not a mounted secret" \
  '0,/--job_token_file=\/run\/secrets\/job_token/s//--job_token_file=\/tmp\/token/' \
  "a job token outside the secrets"
mutate "worker-1: --tls_cert reads secret worker-0-crt" \
  '0,/source: worker-1-crt/s//source: worker-0-crt/' "rank 1 with rank 0's certificate"
# Every GPU for one worker: it would see them all and take GPU 0, as would the other.
mutate "reserves all GPUs, not one" '0,/count: 1/s//count: all/' "a GPU worker reserving every GPU"
echo PASS
