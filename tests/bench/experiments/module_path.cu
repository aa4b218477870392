/*
 * Round 14 experiment (module_path.py drives it): does it matter how a
 * kernel is built and loaded, apart from what it runs?  The seed's Triton
 * kernels are PTX with .reqntid, assembled for sm_90a and loaded as a
 * module of their own (cuModuleLoadData) that the driver launches; the
 * library's are in the runtime's fat binary.  This loads any image (cubin
 * or PTX) as its own module and launches a kernel of it through the driver,
 * as Triton does: with one parameter block or the parameters one by one,
 * through cuLaunchKernel or cuLaunchKernelEx (Triton's call).
 *
 *   nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC module_path.cu -o libmodpath.so
 */
#include <cuda.h>
#include <cuda_runtime.h>

typedef CUresult (*load_fn)(CUmodule *, const void *);
typedef CUresult (*get_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

enum { MP_SLOTS = 24 };
static load_fn mp_module_load;
static get_fn mp_get_function;
static launch_fn mp_drv_launch;
static launch_ex_fn mp_drv_launch_ex;
static CUfunction mp_fn[MP_SLOTS];

static int entry(const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult q;
    return cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
           q == cudaDriverEntryPointSuccess;
}

/* The driver's entry points, and the runtime's primary context current
 * (the one torch and the library use). */
extern "C" int mp_init(void)
{
    if (cudaFree(0) != cudaSuccess)
        return 1;
    if (!entry("cuModuleLoadData", (void **)&mp_module_load) ||
        !entry("cuModuleGetFunction", (void **)&mp_get_function) ||
        !entry("cuLaunchKernel", (void **)&mp_drv_launch) || !entry("cuLaunchKernelEx", (void **)&mp_drv_launch_ex))
        return 2;
    return 0;
}

/* Kernel name of image (a cubin, or PTX text ending in NUL) into slot. */
extern "C" int mp_load(int slot, const void *image, const char *name)
{
    CUmodule m;
    CUresult r;

    if (slot < 0 || slot >= MP_SLOTS)
        return -1;
    if ((r = mp_module_load(&m, image)) != CUDA_SUCCESS)
        return (int)r;
    return (int)mp_get_function(&mp_fn[slot], m, name);
}

/* Slot's kernel on a (gx, gy) grid of bx-thread blocks, its one parameter
 * the block of bytes at params. */
extern "C" int mp_launch(int slot, unsigned gx, unsigned gy, unsigned bx, void *params, void *stream)
{
    void *args[1] = {params};

    if (slot < 0 || slot >= MP_SLOTS || !mp_fn[slot])
        return -1;
    return (int)mp_drv_launch(mp_fn[slot], gx, gy, 1, bx, 1, 1, 0, (CUstream)stream, args, NULL);
}

/* Slot's kernel on a (gx, gy) grid of bx-thread blocks with its parameters
 * one by one (args[i] points at the i-th), as Triton's launcher passes
 * them: for the seed's own cubin. */
extern "C" int mp_launch_args(int slot, unsigned gx, unsigned gy, unsigned bx, void **args, void *stream)
{
    if (slot < 0 || slot >= MP_SLOTS || !mp_fn[slot])
        return -1;
    return (int)mp_drv_launch(mp_fn[slot], gx, gy, 1, bx, 1, 1, 0, (CUstream)stream, args, NULL);
}

/* mp_launch (params: one block) or mp_launch_args (args: one pointer per
 * parameter) through cuLaunchKernelEx with no attributes, the call Triton's
 * launcher makes. */
extern "C" int mp_launch_ex(int slot, unsigned gx, unsigned gy, unsigned bx, void *params, void **args, void *stream)
{
    void *one[1] = {params};
    CUlaunchConfig c = {};

    if (slot < 0 || slot >= MP_SLOTS || !mp_fn[slot])
        return -1;
    c.gridDimX = gx;
    c.gridDimY = gy;
    c.gridDimZ = 1;
    c.blockDimX = bx;
    c.blockDimY = 1;
    c.blockDimZ = 1;
    c.hStream = (CUstream)stream;
    return (int)mp_drv_launch_ex(&c, mp_fn[slot], args ? args : one, NULL);
}
