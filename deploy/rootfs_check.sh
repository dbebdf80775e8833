#!/usr/bin/env bash
# The runtime stage of deploy/Dockerfile without a Docker engine: debootstraps a minimal
# Debian 12 root (what debian:bookworm-slim is made of), apt-installs exactly the runtime
# stage's package list into it, copies the built binaries in, and runs a short 2-shard,
# 2-worker job in it as uid 10001 under tini, on loopback. Proves the package list is enough
# to run the binaries (not only to load them).
#
# usage (root; reaches Debian's mirror; a few minutes the first time):
#   bazel build --config=nocuda //server:ps_server //worker:gpu_worker //deploy:health_probe
#   deploy/rootfs_check.sh [--rootfs=DIR]   # DIR is kept and reused (default: a temp dir)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
rootfs=""
for arg in "$@"; do
  case "$arg" in
    --rootfs=*) rootfs="${arg#*=}" ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "rootfs_check: unknown argument $arg" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "rootfs_check: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || { echo "rootfs_check: apt-get install debootstrap" >&2; exit 2; }
bins=("$here/bazel-bin/server/ps_server" "$here/bazel-bin/worker/gpu_worker"
      "$here/bazel-bin/deploy/health_probe")
for b in "${bins[@]}"; do [[ -x $b ]] || { echo "rootfs_check: build $b first" >&2; exit 2; }; done

# The runtime stage's packages: the indented "name \" lines after FROM debian:bookworm-slim.
packages=$(sed -n '/^FROM debian:bookworm-slim/,/^RUN groupadd/p' "$here/deploy/Dockerfile" \
  | sed -n 's/^ \{6\}\([a-z0-9][a-z0-9.+-]*\) \\$/\1/p' | tr '\n' ' ')
[[ -n $packages ]] || { echo "rootfs_check: no runtime package list found" >&2; exit 1; }
echo "rootfs_check: runtime packages: $packages"

rootfs="${rootfs:-$(mktemp -d -t dptrain-rootfs.XXXXXX)}"
if [[ ! -x "$rootfs/usr/bin/apt-get" ]]; then
  echo "rootfs_check: debootstrap --variant=minbase bookworm $rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$rootfs.log" 2>&1 \
    || { tail -n 5 "$rootfs.log"; exit 1; }
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
mount --bind /proc "$rootfs/proc"
trap 'umount "$rootfs/proc" 2>/dev/null || true' EXIT
chroot "$rootfs" sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends $packages >/dev/null"
cp "${bins[@]}" "$rootfs/usr/local/bin/"
chroot "$rootfs" sh -c 'getent passwd dptrain >/dev/null || { groupadd --gid 10001 dptrain &&
  useradd --no-log-init --uid 10001 --gid dptrain --create-home dptrain; }'
if chroot "$rootfs" sh -c 'ldd /usr/local/bin/*' | grep "not found"; then
  echo "rootfs_check: FAILED: unresolved libraries" >&2
  exit 1
fi

cat >"$rootfs/tmp/job.sh" <<'EOF'
set -eu
cd /tmp
rm -f p0 p1
shards=""
for s in 0 1; do
  tini -s -- ps_server --port=0 --port_file=/tmp/p$s --shard=$s --num_shards=2 --num_workers=2 \
    --lr=0.1 --momentum=0.9 >/tmp/shard$s.log 2>&1 &
  shards="$shards $!"
done
trap 'kill -TERM $shards 2>/dev/null || true' EXIT
for _ in $(seq 50); do [ -s p0 ] && [ -s p1 ] && break; sleep 0.1; done
health_probe --addr=127.0.0.1:$(cat p0) && health_probe --addr=127.0.0.1:$(cat p1)
ps=127.0.0.1:$(cat p0),127.0.0.1:$(cat p1)
flags="--ps=$ps --world_size=2 --model=mlp --epochs=1 --batch_size=128 --lr=0.1 --threads=1"
tini -s -- gpu_worker $flags --rank=1 --max_steps_per_epoch=30 >/tmp/worker1.log 2>&1 &
w1=$!
tini -s -- gpu_worker $flags --rank=0 --max_steps_per_epoch=30
wait $w1
kill -TERM $shards
wait $shards || true
EOF
echo "rootfs_check: 2 shards + 2 workers, 30 steps, as uid 10001 in $rootfs"
timeout 120 chroot --userspec=10001:10001 "$rootfs" /bin/sh /tmp/job.sh
echo "rootfs_check: PASS: the runtime stage's packages run the binaries"
