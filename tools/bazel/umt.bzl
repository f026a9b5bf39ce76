"""Build settings shared by every umtrain target."""

# C11 with POSIX (clock_gettime, strdup); warnings on and treated as errors, so the tree stays clean.
UMT_COPTS = [
    "-std=c11",
    "-D_POSIX_C_SOURCE=200809L",
    "-Wall",
    "-Wextra",
    "-Werror",
]

def umt_test(name, srcs, deps = [], tags = [], size = "small", data = [], args = []):
    """A cmocka unit test linked against the library."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = UMT_COPTS,
        deps = ["//:umtrain"] + deps,
        linkopts = ["-lcmocka"],
        linkstatic = True,
        tags = tags,
        size = size,
        data = data,
        args = args,
    )

def umt_gpu_test(name, srcs, deps = [], size = "small", args = []):
    """A cmocka test that needs a GPU: built only with --config=cuda, tagged 'gpu' so CI skips it."""
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = UMT_COPTS,
        deps = ["//:umtrain"] + deps,
        linkopts = ["-lcmocka"],
        # Static: the binary travels alone to the GPU machine (tools/gpu_bundle.sh).
        linkstatic = True,
        tags = ["gpu"],
        size = size,
        args = args,
        target_compatible_with = select({
            "//:cuda": [],
            "//conditions:default": ["//tools/bazel:needs_config_cuda"],
        }),
    )
