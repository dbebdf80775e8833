#!/usr/bin/env bash
# Makes what a secure dptrain job needs, with openssl: a CA of its own, one certificate per
# process signed by it (usable as server and as client: mutual TLS), and a random job token.
#
# usage: tools/make_certs.sh [--shards=2] [--workers=2] [--days=365] [--namespace=default]
#          [--san=NAME_OR_IP]... [--owner=UID[:GID]] [--force] OUT_DIR
#
# OUT_DIR (created with mode 0700) then holds
#   ca.crt              the job's CA: every process gets it as --tls_ca
#   ca.key              the CA's key (mode 0600): keep it, mount it nowhere
#   job_token           64 hex digits (256 random bits): every process's --job_token_file
#   ps-I.crt, ps-I.key  shard I (I < --shards): --tls_cert, --tls_key
#   worker-R.crt/.key   rank R (R < --workers)
# Names in the certificates (subjectAltName), which a client checks against the address it
# dials: shard I: ps-I and ps-gpu-I (deploy/docker-compose.yml), dptrain-ps-I.dptrain-ps and
# dptrain-ps-I.dptrain-ps.NAMESPACE.svc[.cluster.local] (deploy/k8s), rank R: worker-R and
# worker-gpu-R (rank 0 serves the master reducer or the rendezvous); every certificate also
# names localhost and 127.0.0.1 (local runs, health probes inside a container) and each --san.
# Private keys and the job token are mode 0600 (the binaries warn about a key or token that
# others can read, as ssh does); certificates 0644. --owner=UID[:GID] (as root) hands the
# private files to that user: docker-compose bind-mounts them as secrets, and its containers
# run as uid 10001 (sudo tools/make_certs.sh --owner=10001:10001 deploy/certs).
set -euo pipefail

shards=2 workers=2 days=365 namespace=default force=0 out="" owner=""
extra_sans=()
while (($#)); do
  case "$1" in
    --shards=*) shards="${1#*=}" ;;
    --workers=*) workers="${1#*=}" ;;
    --days=*) days="${1#*=}" ;;
    --namespace=*) namespace="${1#*=}" ;;
    --san=*) extra_sans+=("${1#*=}") ;;
    --owner=*) owner="${1#*=}" ;;
    --force) force=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "make_certs: unknown flag '$1' (see --help)" >&2; exit 2 ;;
    *) [[ -z "$out" ]] || { echo "make_certs: one OUT_DIR only" >&2; exit 2; }; out="$1" ;;
  esac
  shift
done
[[ -n "$out" ]] || { echo "make_certs: usage: tools/make_certs.sh [flags] OUT_DIR (see --help)" >&2; exit 2; }
for n in "$shards" "$workers" "$days"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "make_certs: --shards, --workers and --days take numbers" >&2; exit 2; }
done
command -v openssl >/dev/null || { echo "make_certs: openssl not found (apt-get install openssl)" >&2; exit 1; }
if [[ -e "$out/ca.crt" && $force == 0 ]]; then
  echo "make_certs: $out already holds a CA; pass --force to replace everything in it" >&2
  exit 1
fi

umask 077
mkdir -p "$out"
chmod 0700 "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/openssl.log"
run() { "$@" >>"$log" 2>&1 || { echo "make_certs: failed: $*" >&2; cat "$log" >&2; exit 1; }; }

run openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days "$days" -subj "/CN=dptrain job CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue NAME SAN...: NAME.key and NAME.crt, signed by the CA.
issue() {
  local name=$1
  shift
  local sans=() s
  for s in "$@" localhost 127.0.0.1 ${extra_sans[@]+"${extra_sans[@]}"}; do
    if [[ "$s" =~ ^[0-9.]+$ || "$s" == *:* ]]; then sans+=("IP:$s"); else sans+=("DNS:$s"); fi
  done
  cat >"$work/$name.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$(IFS=,; echo "${sans[*]}")
EXT
  run openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/$name.key" -out "$work/$name.csr" -subj "/CN=$name"
  run openssl x509 -req -in "$work/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -extfile "$work/$name.ext" \
    -out "$out/$name.crt"
  chmod 0644 "$out/$name.crt"
  chmod 0600 "$out/$name.key"
}

for ((i = 0; i < shards; i++)); do
  issue "ps-$i" "ps-$i" "ps-gpu-$i" "dptrain-ps-$i.dptrain-ps" \
    "dptrain-ps-$i.dptrain-ps.$namespace.svc" "dptrain-ps-$i.dptrain-ps.$namespace.svc.cluster.local"
done
for ((r = 0; r < workers; r++)); do
  issue "worker-$r" "worker-$r" "worker-gpu-$r"
done
openssl rand -hex 32 >"$out/job_token"
chmod 0644 "$out/ca.crt"
chmod 0600 "$out/ca.key" "$out/job_token"
if [[ -n "$owner" ]]; then
  # The processes' keys and the token; ca.key stays with whoever ran this.
  chown "$owner" "$out"/ps-*.key "$out"/worker-*.key "$out/job_token" 2>/dev/null ||
    { echo "make_certs: cannot chown the keys to '$owner' (run as root, UID[:GID])" >&2; exit 1; }
fi
echo "make_certs: CA, $shards shard and $workers worker certificate(s) and a job token in $out"
