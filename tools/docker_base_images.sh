#!/usr/bin/env bash
# Makes the base images deploy/Dockerfile names when the engine lacks them and no registry
# can be reached: debian:bookworm and debian:bookworm-slim from one `debootstrap
# --variant=minbase bookworm` root (on a networked machine `docker pull` gives the real ones;
# this script leaves images that exist alone). With --cuda, also stand-ins for
# deploy/Dockerfile.cuda's NVIDIA bases (its ARGs CUDA_DEVEL_IMAGE, CUDA_RUNTIME_IMAGE): the
# minbase root with this machine's CUDA toolkit (${CUDA_PATH:-/usr/local/cuda}: nvcc, cuBLAS,
# cuDNN) at /usr/local/cuda, tagged with both names. Enough to build the image and inspect
# it; a GPU machine uses NVIDIA's real images.
# Needs a reachable engine (tools/docker_engine.sh) and, to debootstrap, root. The minbase
# root is cached as a tarball in $DPTRAIN_DOCKER_CACHE (default /var/cache/dptrain-docker).
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=0
[[ "${1:-}" == "--cuda" ]] && cuda=1

DOCKER=${DOCKER:-docker}
cache=${DPTRAIN_DOCKER_CACHE:-/var/cache/dptrain-docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
have() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }
env_path='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

minbase_tar() {
  local tar="$cache/bookworm-minbase.tar"
  if [[ ! -s "$tar" ]]; then
    ((EUID == 0)) || { echo "base images: debootstrap needs root" >&2; exit 1; }
    command -v debootstrap >/dev/null ||
      DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=300 -y -qq \
        --no-install-recommends debootstrap >/dev/null
    mkdir -p "$cache"
    local root
    root=$(mktemp -d "$cache/root.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    echo "base images: debootstrap --variant=minbase bookworm (once; cached in $tar)" >&2
    if ! debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1; then
      echo "base images: debootstrap failed; its last lines:" >&2
      tail -n 15 "$cache/debootstrap.log" >&2
      exit 1
    fi
    # The suites the official image lists, and its habit of keeping no apt lists.
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
      "$mirror" "$mirror" >"$root/etc/apt/sources.list"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
    rm -rf "$root"
    trap - EXIT
  fi
  echo "$tar"
}

for tag in debian:bookworm debian:bookworm-slim; do
  have "$tag" && continue
  echo "base images: $tag missing and no registry here: importing a local minbase root as $tag"
  tar=$(minbase_tar | tail -n 1)
  "$DOCKER" import --change "$env_path" --change 'CMD ["bash"]' "$tar" "$tag" >/dev/null
done

if ((cuda)); then
  for arg in CUDA_DEVEL_IMAGE CUDA_RUNTIME_IMAGE; do
    tag=$(sed -n "s/^ARG $arg=//p" deploy/Dockerfile.cuda)
    [[ -n "$tag" ]] || { echo "base images: no ARG $arg in deploy/Dockerfile.cuda" >&2; exit 1; }
    have "$tag" && continue
    cuda_dir=$(readlink -f "${CUDA_PATH:-/usr/local/cuda}")
    [[ -x "$cuda_dir/bin/nvcc" ]] ||
      { echo "base images: $tag missing and no CUDA toolkit at $cuda_dir for a stand-in" >&2; exit 1; }
    stand_in=$(sed -n 's/^ARG CUDA_DEVEL_IMAGE=//p' deploy/Dockerfile.cuda)
    if [[ "$tag" != "$stand_in" ]] && have "$stand_in" &&
      [[ "$("$DOCKER" image inspect -f '{{index .Config.Labels "dptrain.stand-in"}}' "$stand_in")" == yes ]]; then
      "$DOCKER" tag "$stand_in" "$tag"
      echo "base images: $tag missing: tagged the stand-in $stand_in as $tag"
      continue
    fi
    echo "base images: $tag missing and no registry here: a stand-in from the minbase root +" \
      "$cuda_dir (this machine's toolkit)"
    tar=$(minbase_tar | tail -n 1)
    cuda_tar="$cache/cuda-stand-in.tar"
    cp "$tar" "$cuda_tar"
    tar -C / -rf "$cuda_tar" --transform "s,^${cuda_dir#/},usr/local/cuda," \
      "${cuda_dir#/}/bin" "${cuda_dir#/}/include" "${cuda_dir#/}/lib" "${cuda_dir#/}/lib64" \
      "${cuda_dir#/}/nvvm" "${cuda_dir#/}/targets"
    "$DOCKER" import --change "$env_path:/usr/local/cuda/bin" --change 'CMD ["bash"]' \
      --change 'LABEL dptrain.stand-in=yes' --change 'ENV CUDA_PATH=/usr/local/cuda' \
      "$cuda_tar" "$tag" >/dev/null
    rm -f "$cuda_tar"
  done
fi
echo "base images: ready"
