"""Build settings shared by every umtrain target."""

# C11 with POSIX (clock_gettime, strdup); warnings on and treated as errors, so the tree stays clean.
UMT_COPTS = [
    "-std=c11",
    "-D_POSIX_C_SOURCE=200809L",
    "-Wall",
    "-Wextra",
    "-Werror",
]

def umt_folder(name, srcs = [], hdrs = [], deps = [], copts = [], **kwargs):
    """One folder's cc_library: its layer of umtrain, whose deps name only the folders it may call
    (a header of any other folder is absent from its compiles' sandbox). Its headers are exported
    as :headers too, for the CUDA compiles (tools/bazel/cuda.bzl). copts: the folder's own flags,
    after the shared ones."""
    native.cc_library(
        name = name,
        srcs = srcs,
        hdrs = hdrs,
        copts = UMT_COPTS + copts,
        deps = deps,
        visibility = ["//visibility:public"],
        **kwargs
    )
    native.filegroup(name = "headers", srcs = hdrs, visibility = ["//visibility:public"])

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
