"""dptrain_fuzzer: a libFuzzer target built with clang-16 (ASan + UBSan) beside the gcc build.

The project's C++ toolchain is gcc; a fuzzer needs clang's coverage instrumentation in the
code under test. So an aspect walks the `deps` of a fuzzer (cc_library targets, transitively)
and compiles each of their sources again with tests/fuzz/clang.sh; the fuzzer links those
objects with the system libraries the deps name in `linkopts`. Every object is a cached Bazel
action, shared by all fuzzers that need it, and a dependency that splits or gains files is
followed without editing anything here. The deps' `defines` reach every object above them, as
they do in a cc_library. (Not supported, not needed so far: `includes` and `copts` of the
deps.)

Adding a target (e.g. a checkpoint reader) is one call in tests/fuzz/BUILD,

    dptrain_fuzzer(
        name = "checkpoint_fuzzer",
        deps = ["//server:checkpoint"],
    )

plus `checkpoint_fuzzer.cc` (LLVMFuzzerTestOneInput) and seed inputs in
`corpus/checkpoint_fuzzer/`; the smoke test (//tests:fuzz_smoke_test) runs every fuzzer of
the package on its corpus and replays `regressions/<name>/`.
"""

_SOURCE_EXTENSIONS = ["cc", "cpp", "c"]

FuzzObjectsInfo = provider(
    doc = "What a fuzzer needs from a cc_library and everything below it.",
    fields = {
        "objects": "depset of clang-instrumented object files",
        "headers": "depset of headers (for compiling dependents)",
        "linkopts": "depset of linker options (system libraries)",
        "defines": "depset of preprocessor definitions (cc_library defines, transitively)",
    },
)

def _compile(ctx, clang, src, headers, defines, subdir):
    obj = ctx.actions.declare_file("_fuzz_objs/%s/%s.o" % (subdir, src.short_path.replace("/", "_")))
    ctx.actions.run(
        executable = clang,
        arguments = ["compile", src.path, obj.path, "-I.", "-I" + ctx.bin_dir.path] +
                    ["-D" + d for d in defines.to_list()],
        inputs = depset([src], transitive = [headers]),
        outputs = [obj],
        mnemonic = "FuzzCompile",
        progress_message = "Compiling %s for fuzzing (clang-16)" % src.short_path,
    )
    return obj

def _split(files):
    sources = [f for f in files if f.extension in _SOURCE_EXTENSIONS]
    headers = [f for f in files if f.extension not in _SOURCE_EXTENSIONS and f.extension != "o"]
    return sources, headers

def _fuzz_objects_aspect_impl(target, ctx):
    below = [d[FuzzObjectsInfo] for d in getattr(ctx.rule.attr, "deps", []) if FuzzObjectsInfo in d]
    srcs = ctx.rule.files.srcs if hasattr(ctx.rule.files, "srcs") else []
    hdrs = ctx.rule.files.hdrs if hasattr(ctx.rule.files, "hdrs") else []
    sources, private_headers = _split(srcs)
    headers = depset(hdrs + private_headers, transitive = [b.headers for b in below])
    defines = depset(
        getattr(ctx.rule.attr, "defines", []),
        transitive = [b.defines for b in below],
    )
    objects = [
        _compile(ctx, ctx.executable._clang, s, headers, defines, target.label.name)
        for s in sources
    ]
    return [FuzzObjectsInfo(
        objects = depset(objects, transitive = [b.objects for b in below]),
        headers = headers,
        linkopts = depset(
            getattr(ctx.rule.attr, "linkopts", []),
            transitive = [b.linkopts for b in below],
        ),
        defines = defines,
    )]

_CLANG_ATTR = {
    "_clang": attr.label(
        default = Label("//tests/fuzz:clang.sh"),
        executable = True,
        cfg = "exec",
        allow_single_file = True,
    ),
}

_fuzz_objects_aspect = aspect(
    implementation = _fuzz_objects_aspect_impl,
    attr_aspects = ["deps"],
    attrs = _CLANG_ATTR,
)

def _fuzzer_impl(ctx):
    below = [d[FuzzObjectsInfo] for d in ctx.attr.deps]
    sources, own_headers = _split(ctx.files.srcs)
    headers = depset(own_headers, transitive = [b.headers for b in below])
    defines = depset(transitive = [b.defines for b in below])
    objects = depset(
        [_compile(ctx, ctx.executable._clang, s, headers, defines, ctx.label.name) for s in sources],
        transitive = [b.objects for b in below],
    )
    linkopts = depset(transitive = [b.linkopts for b in below]).to_list()
    out = ctx.actions.declare_file(ctx.label.name)
    args = ctx.actions.args()
    args.add("link")
    args.add(out)
    args.add_all(objects)
    args.add_all(linkopts)
    ctx.actions.run(
        executable = ctx.executable._clang,
        arguments = [args],
        inputs = objects,
        outputs = [out],
        mnemonic = "FuzzLink",
        progress_message = "Linking fuzzer %s (clang-16)" % ctx.label,
    )
    return [DefaultInfo(executable = out)]

_dptrain_fuzzer = rule(
    implementation = _fuzzer_impl,
    executable = True,
    attrs = dict(_CLANG_ATTR, **{
        "srcs": attr.label_list(allow_files = True),
        "deps": attr.label_list(aspects = [_fuzz_objects_aspect]),
    }),
)

def dptrain_fuzzer(name, deps, srcs = None, **kwargs):
    """A libFuzzer binary `name` from `srcs` (default: NAME.cc) over `deps` (cc_library).

    Its seed inputs are corpus/NAME/* and its crash reproducers regressions/NAME/*.
    """
    _dptrain_fuzzer(
        name = name,
        srcs = srcs or [name + ".cc"],
        deps = deps,
        testonly = True,
        **kwargs
    )

def all_fuzzers(name):
    """Filegroups `name` (every dptrain_fuzzer defined above it in this BUILD file) and
    `name`_inputs (all seed corpora, crash reproducers, dictionaries and input sizes): what
    the smoke test runs."""
    native.filegroup(
        name = name,
        testonly = True,
        srcs = [":" + r["name"] for r in native.existing_rules().values() if r["kind"] == "_dptrain_fuzzer"],
    )
    native.filegroup(
        name = name + "_inputs",
        srcs = native.glob(["corpus/**", "regressions/**", "*.dict", "*.max_len"]),
    )
