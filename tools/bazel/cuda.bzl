"""CUDA sources through nvcc, from a macro of our own (no CUDA rule set can be downloaded)."""

CUDA_HOME = "/usr/local/cuda"

# sm_90 machine code for Hopper (H100/H200); -fPIC so the objects also go into libumtrain.so.
NVCC_FLAGS = "-std=c++17 -arch=sm_90 -O3 -Xcompiler -fPIC,-Wall,-Wextra -Werror all-warnings -I. -Iinclude"

# A target that needs nvcc exists only under --config=cuda: `bazel build //...` skips it otherwise.
CUDA_ONLY = select({
    "//:cuda": [],
    "//conditions:default": ["//tools/bazel:needs_config_cuda"],
})

def umt_cuda_library(name, srcs, hdrs = [], deps = []):
    """One nvcc compile (a genrule) per .cu file, wrapped into a cc_library with cudart, cuBLAS and cuDNN.

    nvcc sees only hdrs and the headers of deps (each dep's package exports them as :headers), so
    an include from a folder the library may not use fails here as it does for C sources.
    """
    visible = hdrs + [dep.split(":")[0] + ":headers" for dep in deps]
    objects = []
    for src in srcs:
        obj = "_cuda_objs/%s/%s" % (name, src.replace("/", "_").replace(".cu", ".pic.o"))
        native.genrule(
            name = "%s_%s" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + visible,
            outs = [obj],
            # A temporary folder of its own: in the sandbox every nvcc may run as the same process
            # id, and nvcc names its intermediate files in TMPDIR after that id, so two parallel
            # compiles sharing /tmp can overwrite each other's files.
            cmd = "tmp=$$(mktemp -d) && TMPDIR=$$tmp %s/bin/nvcc %s -c $(location %s) -o $@ && rm -rf $$tmp" % (
                CUDA_HOME,
                NVCC_FLAGS,
                src,
            ),
            target_compatible_with = CUDA_ONLY,
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps,
        # The device machine has the same CUDA under /usr/local/cuda: found there at run time.
        linkopts = ["-L%s/lib64" % CUDA_HOME, "-Wl,-rpath,%s/lib64" % CUDA_HOME, "-lcudnn", "-lcublas", "-lcudart"],
        target_compatible_with = CUDA_ONLY,
    )
