#!/usr/bin/env python3
"""Offline checks of the deploy files (no Docker engine, no Kubernetes cluster needed).

  check_deploy.py dockerfile --dockerfile=deploy/Dockerfile --cuda=deploy/Dockerfile.cuda \
      --setup=tools/setup.sh --readme=README.md --deploy_build=deploy/BUILD BIN...
  check_deploy.py compose RENDERED.yml      # output of `docker-compose config`
      (security: every process gets --tls_cert/--tls_key/--tls_ca/--job_token_file from
      its own secrets, made by tools/make_certs.sh; the health checks present them too)
  check_deploy.py k8s --overlay=cpu|gpu RENDERED.yaml   # output of `kubectl kustomize`
      (security: the same flags from a mounted Secret, the pod's own certificate by index,
      exec probes that run health_probe with them)
  check_deploy.py flags FILE...             # prints "binary --flag" for every flag passed

Every problem is printed as "FAIL: ..." and the exit status is 1 if there was any.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

try:
    import yaml
except ImportError:  # python3-yaml (tools/setup.sh installs it)
    yaml = None

BINARIES = ("ps_server", "gpu_worker", "health_probe")
# Runtime packages that are not shared libraries of the binaries.
RUNTIME_EXTRAS = {"dataset-fashion-mnist": "the Fashion-MNIST data set",
                  "tini": "PID 1 that forwards signals"}
CUDA_LIB = re.compile(r"lib(cuda|cudart|cublas|cublasLt|cudnn|nvrtc|nccl|cufft|curand)[^/]*$")

problems = []


def fail(msg):
    problems.append(msg)
    print("FAIL: " + msg)


def ok(msg):
    print("ok: " + msg)


# ----------------------------------------------------------------------------- Dockerfiles

def dockerfile_stages(path):
    """[(base_image, stage_name, [(INSTRUCTION, args)])] with continuation lines joined."""
    lines, cur = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not cur and (line.strip().startswith("#") or not line.strip()):
                continue
            if cur and line.strip().startswith("#"):
                continue  # comment inside a continuation
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            lines.append(cur + line)
            cur = ""
    if cur:
        lines.append(cur)
    args = {}
    stages = []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word == "ARG" and not stages:
            name, _, value = rest.partition("=")
            args[name] = value.strip('"')
            continue
        if word == "FROM":
            m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            base = m.group(1)
            base = re.sub(r"\$\{?(\w+)\}?", lambda v: args.get(v.group(1), v.group(0)), base)
            stages.append((base, (m.group(2) or "").lower(), []))
            continue
        if stages:
            stages[-1][2].append((word, rest))
    return stages


def setup_packages(path):
    """The packages=( ... ) list of tools/setup.sh, comments stripped."""
    text = open(path).read()
    m = re.search(r"^packages=\((.*?)^\)", text, re.S | re.M)
    if not m:
        fail(f"{path}: no packages=( ... ) list")
        return set()
    words = []
    for line in m.group(1).splitlines():
        words += line.split("#", 1)[0].split()
    return set(words)


def apt_installs(instructions):
    """Package names of every `apt-get install` in RUN instructions."""
    pkgs = []
    for word, rest in instructions:
        if word != "RUN":
            continue
        for cmd in re.split(r"&&|;|\|\|", rest):
            toks = shlex.split(cmd.replace("\\", " "))
            if "apt-get" in toks and "install" in toks:
                after = toks[toks.index("install") + 1:]
                pkgs += [t for t in after if not t.startswith("-") and "=" not in t]
    return pkgs


def bazel_builds(instructions):
    """[(flags, targets)] of every `bazel build` in RUN instructions."""
    found = []
    for word, rest in instructions:
        if word != "RUN":
            continue
        for cmd in re.split(r"&&|;", rest):
            toks = shlex.split(cmd)
            if len(toks) >= 2 and toks[0] == "bazel" and toks[1] == "build":
                found.append(([t for t in toks[2:] if t.startswith("-")],
                              [t for t in toks[2:] if t.startswith("//")]))
    return found


def readme_build_targets(path):
    targets = set()
    for line in open(path):
        line = line.strip()
        if line.startswith("bazel build "):
            targets |= {t for t in line.split()[2:] if t.startswith("//")}
    return targets


def deploy_build_binaries(path):
    return set(re.findall(r'cc_binary\(\s*name\s*=\s*"([^"]+)"', open(path).read()))


def dpkg_owners(paths):
    """{path: package} for the paths that dpkg knows (one dpkg -S call)."""
    if not paths:
        return {}
    r = subprocess.run(["dpkg", "-S"] + sorted(paths), capture_output=True, text=True)
    owners = {}
    for line in r.stdout.splitlines():
        pkgs, sep, path = line.partition(": ")
        if sep and path in paths and not line.startswith("diversion "):
            owners[path] = pkgs.split(",")[0].split(":")[0].strip()
    return owners


def lib_packages(paths):
    """{path: Debian package shipping the shared library at path, or None} (usr-merge aware:
    dpkg may know /lib/x/libfoo.so.1 as /usr/lib/x/libfoo.so.1, or only the link target)."""
    candidates = {}
    for path in paths:
        alts = [path, os.path.realpath(path)]
        alts += [p[4:] if p.startswith("/usr/") else "/usr" + p for p in list(alts)]
        candidates[path] = list(dict.fromkeys(alts))
    owners = dpkg_owners({c for alts in candidates.values() for c in alts})
    return {path: next((owners[c] for c in alts if c in owners), None)
            for path, alts in candidates.items()}


def ldd_libraries(binaries):
    libs = {}
    for b in binaries:
        r = subprocess.run(["ldd", b], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"ldd {b}: {r.stderr.strip()}")
            continue
        for line in r.stdout.splitlines():
            line = line.strip()
            m = re.match(r"(\S+) => (\S+) \(", line) or re.match(r"(/\S+) \(", line)
            if not m:
                if "not found" in line:
                    fail(f"{b}: {line}")
                continue
            path = m.group(2) if m.lastindex == 2 else m.group(1)
            libs.setdefault(path, set()).add(os.path.basename(b))
    return libs


def check_dockerfile(a):
    stages = dockerfile_stages(a.dockerfile)
    names = [s[1] for s in stages]
    print(f"{os.path.basename(a.dockerfile)}: stages {names} from {[s[0] for s in stages]}")
    if len(stages) < 2:
        fail("expected a build stage and a runtime stage")
        return
    build = stages[0]
    if build[0] != "debian:bookworm" or build[1] != "build":
        fail(f"the first stage must be `FROM debian:bookworm AS build`, got {build[0]} AS {build[1]}")
    # Build packages: exactly tools/setup.sh's list.
    wanted = setup_packages(a.setup)
    runs = " ".join(r for w, r in build[2] if w == "RUN")
    via_setup = re.search(r"(^|[\s/])tools/setup\.sh\b", runs) is not None
    explicit = set(apt_installs(build[2]))
    if via_setup:
        copied = any(w == "COPY" and ("tools/setup.sh" in r or r.split()[0] == ".")
                     for w, r in build[2])
        if not copied:
            fail("the build stage runs tools/setup.sh without copying it first")
        else:
            ok(f"build stage installs tools/setup.sh's {len(wanted)} packages by running it")
        if explicit:
            fail(f"the build stage installs packages besides tools/setup.sh: {sorted(explicit)}")
    elif explicit != wanted:
        fail("build-stage apt list differs from tools/setup.sh: only in Dockerfile "
             f"{sorted(explicit - wanted)}, only in setup.sh {sorted(wanted - explicit)}")
    else:
        ok("build-stage apt list equals tools/setup.sh's")
    # Build command: the README's targets, with --config=nocuda.
    builds = bazel_builds(build[2])
    readme = readme_build_targets(a.readme)
    if not readme:
        fail(f"{a.readme}: no `bazel build //...` command found")
    if len(builds) != 1:
        fail(f"expected one `bazel build` in the build stage, found {len(builds)}")
    else:
        flags, targets = builds[0]
        if "--config=nocuda" not in flags:
            fail(f"the build command lacks --config=nocuda: {flags}")
        if not readme <= set(targets):
            fail(f"the build misses the README's targets {sorted(readme - set(targets))}")
        extra = set(targets) - readme
        known = {"//deploy:" + n for n in deploy_build_binaries(a.deploy_build)}
        if not extra <= known:
            fail(f"unknown build targets {sorted(extra - known)} (not README's, not in deploy/BUILD)")
        if set(flags) - {"--config=nocuda"}:
            fail(f"unexpected bazel flags {sorted(set(flags) - {'--config=nocuda'})}")
        ok(f"build command: bazel build {' '.join(flags + targets)} (README: {' '.join(sorted(readme))})")
    # Runtime stage.
    runtime = next((s for s in stages if s[1] == "runtime"), None)
    if runtime is None:
        fail("no stage named runtime")
        return
    if runtime[0] != "debian:bookworm-slim":
        fail(f"the runtime stage must be FROM debian:bookworm-slim, got {runtime[0]}")
    listed = apt_installs(runtime[2])
    if len(listed) != len(set(listed)):
        fail("a runtime package is listed twice")
    listed = set(listed)
    libs = ldd_libraries(a.binaries)
    needed = {}
    owners = lib_packages(set(libs))
    for path, users in sorted(libs.items()):
        pkg = owners[path]
        if pkg is None:
            if CUDA_LIB.search(path) or "/cuda" in path:
                print(f"note: {path} is a CUDA library (deploy/Dockerfile.cuda's base image has it)")
            else:
                fail(f"{path} (used by {sorted(users)}) belongs to no Debian package")
            continue
        needed.setdefault(pkg, set()).add(os.path.basename(path))
    for pkg in sorted(needed):
        if pkg not in listed:
            fail(f"runtime stage lacks {pkg} (provides {sorted(needed[pkg])})")
    stale = listed - set(needed) - set(RUNTIME_EXTRAS)
    if stale:
        fail(f"runtime packages that no binary needs (stale?): {sorted(stale)}")
    if "dataset-fashion-mnist" not in listed:
        fail("the runtime stage does not install dataset-fashion-mnist")
    ok(f"{len(libs)} shared libraries of {len(a.binaries)} binaries come from "
       f"{len(needed)} packages, all installed by the runtime stage: {' '.join(sorted(needed))}")
    # From the build stage, or from a stage `FROM ${BINARIES}` whose default is the build
    # stage (a prebuilt-binaries image may replace it).
    sources = {"build"} | {s[1] for s in stages if s[0] == "build" and s[1]}
    copies = " ".join(r for w, r in runtime[2]
                      if w == "COPY" and any(f"--from={n} " in r + " " for n in sources))
    for b in BINARIES:
        if b not in copies or "/usr/local/bin" not in copies:
            fail(f"the runtime stage does not copy {b} to /usr/local/bin")
    users = [r for w, r in runtime[2] if w == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        fail("the runtime stage must end as a non-root USER")
    entry = [r for w, r in runtime[2] if w == "ENTRYPOINT"]
    if not entry:
        fail("the runtime stage has no ENTRYPOINT")
    for stage, binary in (("ps-server", "ps_server"), ("gpu-worker", "gpu_worker")):
        s = next((s for s in stages if s[1] == stage), None)
        if s is None or s[0] != "runtime":
            fail(f"no stage `FROM runtime AS {stage}`")
            continue
        e = [r for w, r in s[2] if w == "ENTRYPOINT"]
        if not e or binary not in e[-1]:
            fail(f"stage {stage}: ENTRYPOINT does not run {binary}")
    if stages[-1][0] != "runtime":
        fail("the last (default) stage should be the generic runtime image")
    ok("runtime stage: binaries in /usr/local/bin, non-root user, ps-server/gpu-worker targets")
    check_ignore(a.dockerfile)
    if a.cuda:
        check_cuda(a.cuda, builds)


def check_ignore(dockerfile):
    path = dockerfile + ".dockerignore"
    if not os.path.exists(path):
        fail(f"{path} missing (bazel-* links and .git would enter the build context)")
        return
    entries = {l.strip() for l in open(path) if l.strip() and not l.startswith("#")}
    for e in ("bazel-*", ".git"):
        if e not in entries:
            fail(f"{path} does not exclude {e}")


CUDA_PLUGIN = "//worker/cuda:libdptrain_cuda.so"


def check_cuda(full_path, main_builds):
    path = os.path.basename(full_path)
    stages = dockerfile_stages(full_path)
    print(f"{path}: stages {[s[1] for s in stages]} from {[s[0] for s in stages]}")
    build = next((s for s in stages if s[1] == "build"), None)
    if build is None or build[0] != "debian:bookworm":
        fail(f"{path}: the build stage must be the same Debian 12 build as deploy/Dockerfile")
        return
    runs = " ".join(r for w, r in build[2] if w == "RUN")
    if not re.search(r"tools/setup\.sh", runs):
        fail(f"{path}: the build stage does not run tools/setup.sh")
    # deploy/Dockerfile's targets plus the CUDA backend plugin, with CUDA (no --config=nocuda).
    want = [([f for f in flags if f != "--config=nocuda"], targets + [CUDA_PLUGIN])
            for flags, targets in main_builds]
    if bazel_builds(build[2]) != want:
        fail(f"{path}: its bazel build is not deploy/Dockerfile's plus {CUDA_PLUGIN} with CUDA: "
             f"{bazel_builds(build[2])}")
    if not any(w == "COPY" and "/usr/local/cuda" in r for w, r in build[2]):
        fail(f"{path}: the build stage does not get the CUDA toolkit into /usr/local/cuda")
    runtime = stages[-1]
    if not re.match(r"nvidia/cuda:13\.[0-9.]+-cudnn-runtime-ubuntu", runtime[0]):
        fail(f"{path}: runtime base {runtime[0]} is not a CUDA 13 cuDNN runtime image")
    text = open(full_path).read()
    for needle, what in (("/opt/dptrain/lib", "the bundled libraries"),
                         ("LD_LIBRARY_PATH", "LD_LIBRARY_PATH"),
                         ("/usr/share/datasets/fashion-mnist", "the data set"),
                         ("STATUS:", "the status note"),
                         ("libdptrain_cuda.so", "the CUDA backend plugin")):
        if needle not in text:
            fail(f"{path}: no {what}")
    users = [r for w, r in runtime[2] if w == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        fail(f"{path}: must end as a non-root USER")
    check_ignore(full_path)
    ok(f"{path}: same build as deploy/Dockerfile, runtime {runtime[0]}")


# ----------------------------------------------------------------------------- flags

def parse_flags(argv):
    """{flag: value} of --name=value arguments."""
    flags = {}
    for arg in argv:
        m = re.match(r"--([A-Za-z0-9_]+)(?:=(.*))?$", arg)
        if m:
            flags[m.group(1)] = m.group(2)
    return flags


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def containers_of(doc):
    spec = (doc.get("spec") or {}).get("template", {}).get("spec", {})
    return spec.get("containers") or []


def commands_in(path):
    """[(where, argv)] of every binary invocation in a compose file or manifest stream."""
    found = []
    for doc in load_docs(path):
        if "services" in doc:
            for name, svc in (doc.get("services") or {}).items():
                cmd = svc.get("command")
                if isinstance(cmd, str):
                    cmd = shlex.split(cmd)
                if cmd:
                    found.append((f"{path}:{name}", cmd))
                test = (svc.get("healthcheck") or {}).get("test")
                if isinstance(test, list) and test[:1] in (["CMD"], ["CMD-SHELL"]):
                    test = test[1:] if test[0] == "CMD" else shlex.split(test[1])
                    found.append((f"{path}:{name}:healthcheck", test))
        for c in containers_of(doc):
            argv = list(c.get("command") or []) + list(c.get("args") or [])
            if argv:
                found.append((f"{path}:{doc['metadata']['name']}/{c['name']}", argv))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                ex = ((c.get(probe) or {}).get("exec") or {}).get("command")
                if ex:
                    found.append((f"{path}:{doc['metadata']['name']}/{c['name']}:{probe}", ex))
    return found


def binary_of(argv):
    """The dptrain binary an argv runs (skipping tini), or None."""
    for i, a in enumerate(argv):
        base = os.path.basename(a)
        if base in BINARIES:
            return base, argv[i + 1:]
        if base in ("sh", "bash") and "-c" in argv:
            script = argv[argv.index("-c") + 1]
            return binary_of(shlex.split(script.replace("exec ", "")))
    return None, []


def cmd_flags(a):
    for path in a.files:
        for where, argv in commands_in(path):
            binary, rest = binary_of(argv)
            if binary is None:
                fail(f"{where}: runs no dptrain binary: {argv}")
                continue
            for arg in rest:
                if not arg.startswith("--"):
                    fail(f"{where}: {binary} gets a non-flag argument {arg!r}")
            for flag in parse_flags(rest):
                print(f"{binary} --{flag} {where}")


# ----------------------------------------------------------------------------- compose

def check_compose(a):
    doc = load_docs(a.file)[0]
    services = doc.get("services") or {}
    groups = {}
    for name, svc in services.items():
        profile = ",".join(svc.get("profiles") or []) or "default"
        groups.setdefault(profile, {})[name] = svc
    for profile, svcs in sorted(groups.items()):
        check_compose_job(profile, svcs, doc.get("secrets") or {})


SECURITY_FLAGS = ("tls_cert", "tls_key", "tls_ca", "job_token_file")


def expected_files(cert_stem):
    """The file each security flag names: the process's own certificate and key (as
    tools/make_certs.sh names them), the job's CA and token."""
    return {"tls_cert": f"{cert_stem}.crt", "tls_key": f"{cert_stem}.key", "tls_ca": "ca.crt",
            "job_token_file": "job_token"}


def given_security_flags(where, flags):
    """(flag, value) of every security flag given; a failure for each one missing."""
    for flag in SECURITY_FLAGS:
        if flags.get(flag):
            yield flag, flags[flag]
        else:
            fail(f"{where}: no --{flag} (security is on in the deploy files)")


def check_compose_security(where, svc, flags, secrets, process):
    """The four security flags of a compose service, each a file under /run/secrets that one
    of its secrets provides; its own certificate and key are `process`'s (ps-I, worker-R) and
    every secret is a file that tools/make_certs.sh writes; the health check presents the
    same flags."""
    mounted = {}
    for entry in svc.get("secrets") or []:
        if isinstance(entry, str):
            entry = {"source": entry}
        mounted[entry.get("target") or entry["source"]] = entry["source"]
    want_file = expected_files(process)
    for flag, value in given_security_flags(where, flags):
        if not value.startswith("/run/secrets/"):
            fail(f"{where}: --{flag}={value} is not a mounted secret (/run/secrets/...)")
            continue
        source = mounted.get(value[len("/run/secrets/"):])
        if source is None:
            fail(f"{where}: --{flag}={value}, but no secret is mounted there")
            continue
        path = str((secrets.get(source) or {}).get("file") or "")
        if os.path.basename(path) != want_file[flag] or os.path.basename(
                os.path.dirname(path)) != "certs":
            fail(f"{where}: --{flag} reads secret {source} = {path or '(no file)'}, expected "
                 f"certs/{want_file[flag]} (tools/make_certs.sh)")
    test = (svc.get("healthcheck") or {}).get("test")
    if test and "health_probe" in " ".join(test):
        probe = parse_flags(test)
        for flag in SECURITY_FLAGS:
            if probe.get(flag) != flags.get(flag):
                fail(f"{where}: the health check's --{flag}={probe.get(flag)} is not the "
                     f"process's {flags.get(flag)}")


def check_compose_job(profile, svcs, secrets):
    ps, workers = {}, {}
    for name, svc in svcs.items():
        cmd = svc.get("command") or []
        binary, rest = binary_of(cmd)
        flags = parse_flags(rest)
        if binary == "ps_server":
            ps[name] = (svc, flags)
        elif binary == "gpu_worker":
            workers[name] = (svc, flags)
        else:
            fail(f"[{profile}] {name}: runs neither ps_server nor gpu_worker")
        if not svc.get("image"):
            fail(f"[{profile}] {name}: no image")
    where = f"compose profile {profile}"
    if not ps or not workers:
        fail(f"{where}: needs shards and workers, got {sorted(ps)} / {sorted(workers)}")
        return
    n_shards, n_workers = len(ps), len(workers)
    shard_addr = {}
    lrs = set()
    checkpoint_every = set()
    for name, (svc, f) in ps.items():
        for key, want in (("num_shards", n_shards), ("num_workers", n_workers)):
            if f.get(key) != str(want):
                fail(f"{where}: {name} --{key}={f.get(key)}, but the file has {want}")
        if not f.get("port") or f.get("port") == "0":
            fail(f"{where}: {name} needs a fixed --port inside the compose network")
        shard_addr[int(f.get("shard", -1))] = f"{name}:{f.get('port')}"
        check_compose_security(f"{where}: {name}", svc, f, secrets, f"ps-{f.get('shard')}")
        lrs.add(f.get("lr"))
        test = (svc.get("healthcheck") or {}).get("test") or []
        if "health_probe" not in " ".join(test) or f"127.0.0.1:{f.get('port')}" not in " ".join(test):
            fail(f"{where}: {name} healthcheck does not probe its port with health_probe")
        restart = str(svc.get("restart", "no"))
        if restart not in ("no", "False"):
            # A restarted shard must come back from a checkpoint on a volume of its own.
            ckpt_dir = f.get("checkpoint_dir")
            mounts = [str(v).split(":")[1] for v in svc.get("volumes") or [] if ":" in str(v)]
            if not ckpt_dir or ckpt_dir not in mounts:
                fail(f"{where}: {name} restart {restart!r} without --checkpoint_dir on a volume: "
                     "a restarted shard would lose its state")
            if not re.match(r"[1-9][0-9]*$", f.get("checkpoint_every", "0")):
                fail(f"{where}: {name} restarts but writes no checkpoints (--checkpoint_every)")
        checkpoint_every.add(f.get("checkpoint_every"))
    if len(checkpoint_every) > 1:
        fail(f"{where}: shards checkpoint at different intervals {sorted(map(str, checkpoint_every))}: "
             "workers can only go back to a step every shard has")
    if sorted(shard_addr) != list(range(n_shards)):
        fail(f"{where}: shard indices {sorted(shard_addr)} are not 0..{n_shards - 1}")
    ps_list = ",".join(shard_addr[i] for i in sorted(shard_addr))
    ranks = []
    for name, (svc, f) in workers.items():
        if f.get("ps") != ps_list:
            fail(f"{where}: {name} --ps={f.get('ps')}, expected {ps_list} (shard order)")
        if f.get("world_size") != str(n_workers):
            fail(f"{where}: {name} --world_size={f.get('world_size')}, the file has {n_workers}")
        ranks.append(int(f.get("rank", -1)))
        check_compose_security(f"{where}: {name}", svc, f, secrets, f"worker-{f.get('rank')}")
        lrs.add(f.get("lr"))
        restart = str(svc.get("restart", "no"))
        if restart not in ("no", "False") and not re.match(r"on-failure:[1-3]$", restart):
            fail(f"{where}: {name} restart {restart!r} would mask failures")
        deps = svc.get("depends_on") or {}
        for p in ps:
            cond = deps.get(p, {}).get("condition") if isinstance(deps, dict) else None
            if cond != "service_healthy":
                fail(f"{where}: {name} does not wait for {p} to be healthy")
        if profile == "gpu":
            devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations")
                       or {}).get("devices") or []
            gpus = [d for d in devices if "gpu" in (d.get("capabilities") or [])]
            if not gpus:
                fail(f"{where}: {name} reserves no GPU")
            # One GPU per worker: the container then sees it as GPU 0, whatever its LOCAL_RANK
            # (gpu_worker --device=auto takes LOCAL_RANK mod the visible GPUs).
            for d in gpus:
                ids = d.get("device_ids")
                if (str(d.get("count")) != "1" if ids is None else len(ids) != 1):
                    fail(f"{where}: {name} reserves {d.get('count', ids)} GPUs, not one")
    if sorted(ranks) != list(range(n_workers)):
        fail(f"{where}: ranks {sorted(ranks)} are not 0..{n_workers - 1}")
    if len(lrs - {None}) > 1:
        fail(f"{where}: learning rates differ: {sorted(lrs - {None})}")
    ok(f"{where}: {n_shards} shards, {n_workers} workers, --ps={ps_list}, ranks 0..{n_workers - 1}, "
       "mutual TLS + job token from secrets")


# ----------------------------------------------------------------------------- Kubernetes

KINDS = {("v1", "ConfigMap"), ("v1", "Service"), ("apps/v1", "StatefulSet"), ("batch/v1", "Job"),
         ("networking.k8s.io/v1", "NetworkPolicy")}
QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G)?$")
SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20,
         "Gi": 2**30, "Ti": 2**40}


def quantity(q):
    m = QUANTITY.match(str(q))
    return float(m.group(1)) * SCALE[m.group(2)] if m else None


def check_k8s(a):
    docs = load_docs(a.file)
    by_kind = {}
    for d in docs:
        for field in ("apiVersion", "kind", "metadata"):
            if field not in d:
                fail(f"a document lacks {field}: {str(d)[:80]}")
        if (d.get("apiVersion"), d.get("kind")) not in KINDS:
            fail(f"unexpected {d.get('apiVersion')} {d.get('kind')}")
        if not (d.get("metadata") or {}).get("name"):
            fail(f"{d.get('kind')} without metadata.name")
        by_kind.setdefault(d.get("kind"), []).append(d)
    for kind in ("ConfigMap", "Service", "StatefulSet", "Job"):
        if len(by_kind.get(kind, [])) != 1:
            fail(f"expected one {kind}, found {len(by_kind.get(kind, []))}")
            return
    cm, svc, sts, job = (by_kind[k][0] for k in ("ConfigMap", "Service", "StatefulSet", "Job"))
    data = cm.get("data") or {}
    for k, v in data.items():
        if not isinstance(v, str):
            fail(f"ConfigMap value {k} must be a string, got {v!r}")
    # Headless service for the StatefulSet.
    s = sts["spec"]
    tmpl_labels = s["template"]["metadata"].get("labels") or {}
    if s.get("serviceName") != svc["metadata"]["name"]:
        fail(f"StatefulSet serviceName {s.get('serviceName')} is not the Service")
    if svc["spec"].get("clusterIP") != "None":
        fail("the shards' Service must be headless (clusterIP: None)")
    for what, sel in (("Service selector", svc["spec"].get("selector") or {}),
                      ("StatefulSet selector", (s.get("selector") or {}).get("matchLabels") or {})):
        if not sel or any(tmpl_labels.get(k) != v for k, v in sel.items()):
            fail(f"{what} {sel} does not match the shard pods' labels {tmpl_labels}")
    if s.get("podManagementPolicy") != "Parallel":
        fail("StatefulSet podManagementPolicy should be Parallel (shards start together)")
    # Indexed Job.
    j = job["spec"]
    if j.get("completionMode") != "Indexed":
        fail("the workers' Job must be completionMode: Indexed (index = rank)")
    if j["template"]["spec"].get("restartPolicy") not in ("Never", "OnFailure"):
        fail("Job pods need restartPolicy Never or OnFailure")
    if j.get("backoffLimit", 6) > 3:
        fail("Job backoffLimit should be at most 3: more retries would mask a broken job")
    # Scale consistency.
    n_shards, n_workers = data.get("NUM_SHARDS"), data.get("NUM_WORKERS")
    if str(s.get("replicas")) != n_shards:
        fail(f"StatefulSet replicas {s.get('replicas')} != NUM_SHARDS {n_shards}")
    if not (str(j.get("completions")) == str(j.get("parallelism")) == n_workers):
        fail(f"Job completions/parallelism {j.get('completions')}/{j.get('parallelism')} "
             f"!= NUM_WORKERS {n_workers}")
    # Containers.
    ps_c = containers_of(sts)
    wk_c = containers_of(job)
    if len(ps_c) != 1 or len(wk_c) != 1:
        fail("expected one container per pod")
        return
    ps_c, wk_c = ps_c[0], wk_c[0]
    ps_flags = check_container("StatefulSet", ps_c, data, "ps_server", job=False)
    wk_flags = check_container("Job", wk_c, data, "gpu_worker", job=True)
    # A secured process serves its plain-HTTP metrics on loopback unless told otherwise: the
    # pods Prometheus scrapes say 0.0.0.0, and a NetworkPolicy keeps that port to the
    # monitoring namespace.
    for what, obj, flags in (("StatefulSet", sts, ps_flags), ("Job", job, wk_flags)):
        annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations.get("prometheus.io/scrape") != "true":
            continue
        if flags.get("metrics_bind_address") != "0.0.0.0":
            fail(f"{what}: scraped by Prometheus but not --metrics_bind_address=0.0.0.0 (a "
                 "secured process serves metrics on loopback only)")
        port = annotations.get("prometheus.io/port")
        guarded = False
        for pol in by_kind.get("NetworkPolicy", []):
            for rule in (pol.get("spec") or {}).get("ingress") or []:
                ports = [str(p.get("port")) for p in rule.get("ports") or []]
                if port in ports and rule.get("from"):
                    guarded = True
                if any(p.get("endPort") and int(p["port"]) <= int(port) <= int(p["endPort"])
                       for p in rule.get("ports") or []):
                    fail(f"NetworkPolicy {pol['metadata']['name']}: a port range opens the "
                         f"metrics port {port}")
        if not guarded:
            fail(f"{what}: no NetworkPolicy keeps its metrics port {port} to a 'from' selector")
    port = ps_flags.get("port")
    if not port or port == "0":
        fail("ps_server needs a fixed --port")
    if port not in [str(p.get("containerPort")) for p in ps_c.get("ports") or []]:
        fail(f"--port={port} is not a containerPort")
    svc_ports = svc["spec"].get("ports") or []
    if not any(str(p.get("port")) == port for p in svc_ports):
        fail(f"the Service does not expose {port}")
    pod_security = sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]
    check_k8s_security("StatefulSet", pod_security[0], ps_c, ps_flags, "ps", "SHARD",
                       {"readinessProbe": port, "livenessProbe": port})
    check_k8s_security("Job", pod_security[1], wk_c, wk_flags, "worker", "JOB_COMPLETION_INDEX",
                       {"livenessProbe": wk_flags.get("health_port")})
    shard_env = {e["name"]: e for e in ps_c.get("env") or []}.get("SHARD", {})
    field = ((shard_env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if ps_flags.get("shard") == "$(SHARD)" and field != "metadata.labels['apps.kubernetes.io/pod-index']":
        fail("--shard=$(SHARD) but SHARD is not the pod-index label (downward API)")
    if ps_flags.get("lr") != wk_flags.get("lr"):
        fail("workers and shards get different --lr")
    # Checkpoints on a claim of each shard's own (a restarted pod comes back from them).
    ckpt_dir = ps_flags.get("checkpoint_dir")
    mounts = {m.get("name"): m.get("mountPath") for m in ps_c.get("volumeMounts") or []}
    claims = [t["metadata"]["name"] for t in s.get("volumeClaimTemplates") or []]
    if not ckpt_dir or ckpt_dir not in mounts.values():
        fail("ps_server needs --checkpoint_dir on a mounted volume")
    elif [n for n, path in mounts.items() if path == ckpt_dir][0] not in claims:
        fail("the checkpoint volume is not a volumeClaimTemplate (it would die with the pod)")
    if not re.match(r"([1-9][0-9]*|\$\(CHECKPOINT_EVERY\))$", ps_flags.get("checkpoint_every", "")):
        fail("ps_server needs --checkpoint_every")
    elif not re.match(r"[1-9][0-9]*$", expand(ps_flags["checkpoint_every"], data)):
        fail(f"--checkpoint_every expands to {expand(ps_flags['checkpoint_every'], data)!r}")
    if "rank" in wk_flags:
        fail("the worker must take its rank from JOB_COMPLETION_INDEX, not --rank")
    # PS_ADDRESSES names every shard in order: <sts>-<i>.<service>:<port>.
    sts_name, svc_name = sts["metadata"]["name"], svc["metadata"]["name"]
    want = ",".join(f"{sts_name}-{i}.{svc_name}:{port}" for i in range(int(n_shards or 0)))
    ps_value = expand(wk_flags.get("ps", ""), data)
    if ps_value != want:
        fail(f"--ps expands to {ps_value!r}, expected {want!r}")
    if a.overlay == "gpu":
        res = wk_c.get("resources") or {}
        if str((res.get("limits") or {}).get("nvidia.com/gpu")) != "1":
            fail("gpu overlay: the worker does not limit nvidia.com/gpu to 1")
        if "cuda" not in wk_c.get("image", ""):
            fail(f"gpu overlay: the worker image {wk_c.get('image')} is not the CUDA image")
    elif "nvidia.com/gpu" in str(wk_c.get("resources")):
        fail("cpu overlay asks for a GPU")
    ok(f"[{a.overlay}] {n_shards} shards ({sts_name}, headless {svc_name}:{port}, mutual TLS + "
       "job token from Secrets, health_probe probes), "
       f"{n_workers} workers (Indexed Job), --ps={want}")


def check_k8s_security(kind, pod, c, flags, role, index, probes):
    """The four security flags from a mounted Secret, the pod's own certificate chosen by
    $(index); files the container's user can read; `probes` ({probe: port}) exec health_probe
    on 127.0.0.1:port with the same files (${index}: the probe runs in a shell)."""
    where = f"{kind} container {c.get('name')}"
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    mounts = {}
    for m in c.get("volumeMounts") or []:
        secret = (volumes.get(m.get("name")) or {}).get("secret")
        if secret:
            mounts[m.get("mountPath", "").rstrip("/")] = (secret, m)
    want = expected_files(f"{role}-$({index})")
    for flag, value in given_security_flags(where, flags):
        directory, _, name = value.rpartition("/")
        if directory not in mounts:
            fail(f"{where}: --{flag}={value} is not in a mounted Secret")
            continue
        secret, mount = mounts[directory]
        if not mount.get("readOnly") and not mount.get("_reported"):
            mount["_reported"] = True
            fail(f"{where}: the Secret at {directory} is not mounted readOnly")
        if name != want[flag]:
            fail(f"{where}: --{flag} names {name}, expected {want[flag]} (this pod's own)")
        mode = secret.get("defaultMode", 0o644)
        group = (pod.get("securityContext") or {}).get("fsGroup")
        user = (pod.get("securityContext") or {}).get("runAsUser")
        if user not in (None, 0) and not (group is not None and mode & 0o040) and not mode & 0o004:
            fail(f"{where}: uid {user} cannot read Secret {secret.get('secretName')} "
                 f"(defaultMode {oct(mode)}, fsGroup {group})")
    for probe, port in probes.items():
        ex = ((c.get(probe) or {}).get("exec") or {}).get("command") or []
        binary, rest = binary_of(ex)
        got = parse_flags(rest)
        if binary != "health_probe" or got.get("addr") != f"127.0.0.1:{port}":
            fail(f"{where}: {probe} does not run health_probe --addr=127.0.0.1:{port} "
                 "(Kubernetes' grpc probes cannot speak mutual TLS)")
            continue
        for flag in SECURITY_FLAGS:
            mine = (flags.get(flag) or "").replace(f"$({index})", f"${{{index}}}")
            if got.get(flag) != mine:
                fail(f"{where}: {probe} --{flag}={got.get(flag)}, expected {mine}")


def expand(value, data):
    return re.sub(r"\$\((\w+)\)", lambda m: data.get(m.group(1), m.group(0)), value)


def check_container(kind, c, data, binary, job):
    where = f"{kind} container {c.get('name')}"
    if not c.get("image"):
        fail(f"{where}: no image")
    argv = list(c.get("command") or []) + list(c.get("args") or [])
    b, rest = binary_of(argv)
    if b != binary:
        fail(f"{where}: runs {b}, expected {binary}")
    env = {e["name"] for e in c.get("env") or []}
    from_cm = any((ef.get("configMapRef") or {}).get("name") for ef in c.get("envFrom") or [])
    defined = env | (set(data) if from_cm else set()) | ({"JOB_COMPLETION_INDEX"} if job else set())
    for arg in rest:
        for var in re.findall(r"\$\((\w+)\)", arg):
            if var not in defined:
                fail(f"{where}: {arg} uses $({var}), which no env/ConfigMap entry defines")
    res = c.get("resources") or {}
    for kind_ in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if quantity((res.get(kind_) or {}).get(r)) is None:
                fail(f"{where}: resources.{kind_}.{r} missing or malformed")
    for r in ("cpu", "memory"):
        lo, hi = (quantity((res.get(k) or {}).get(r)) for k in ("requests", "limits"))
        if lo is not None and hi is not None and lo > hi:
            fail(f"{where}: {r} request above its limit")
    return parse_flags(rest)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dockerfile")
    d.add_argument("--dockerfile", required=True)
    d.add_argument("--cuda")
    d.add_argument("--setup", required=True)
    d.add_argument("--readme", required=True)
    d.add_argument("--deploy_build", required=True)
    d.add_argument("binaries", nargs="+")
    c = sub.add_parser("compose")
    c.add_argument("file")
    k = sub.add_parser("k8s")
    k.add_argument("--overlay", required=True)
    k.add_argument("file")
    f = sub.add_parser("flags")
    f.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd != "dockerfile" and yaml is None:
        print("FAIL: python3-yaml is missing (tools/setup.sh installs it)")
        return 1
    {"dockerfile": check_dockerfile, "compose": check_compose, "k8s": check_k8s,
     "flags": cmd_flags}[a.cmd](a)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
