"""CUDA sources through nvcc, from a macro of our own (no CUDA rule set can be downloaded)."""

CUDA_HOME = "/usr/local/cuda"

# sm_90 machine code for Hopper (H100/H200); -fPIC so the objects also go into libumtrain.so.
NVCC_FLAGS = "-std=c++17 -arch=sm_90 -O3 -Xcompiler -fPIC,-Wall,-Wextra -Werror all-warnings -I. -Iinclude"

def umt_cuda_library(name, srcs, hdrs = []):
    """One nvcc compile (a genrule) per .cu file, wrapped into a cc_library with cudart, cuBLAS and cuDNN."""
    objects = []
    for src in srcs:
        obj = "_cuda_objs/%s/%s" % (name, src.replace("/", "_").replace(".cu", ".pic.o"))
        native.genrule(
            name = "%s_%s" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            # A temporary folder of its own: in the sandbox every nvcc may run as the same process
            # id, and nvcc names its intermediate files in TMPDIR after that id, so two parallel
            # compiles sharing /tmp can overwrite each other's files.
            cmd = "tmp=$$(mktemp -d) && TMPDIR=$$tmp %s/bin/nvcc %s -c $(location %s) -o $@ && rm -rf $$tmp" % (
                CUDA_HOME,
                NVCC_FLAGS,
                src,
            ),
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        # The device machine has the same CUDA under /usr/local/cuda: found there at run time.
        linkopts = ["-L%s/lib64" % CUDA_HOME, "-Wl,-rpath,%s/lib64" % CUDA_HOME, "-lcudnn", "-lcublas", "-lcudart"],
    )
