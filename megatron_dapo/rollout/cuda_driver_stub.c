/* A stand-in for the CUDA driver library (libcuda.so.1) on a machine without a GPU: the shim that
 * lets SGLang's engine run on the CPU test bench (docs/hybrid.md, "SGLang on a CPU").
 *
 * The shared objects of the sglang-kernel wheel are linked against libcuda.so.1, so on a machine
 * without the driver `import sgl_kernel` (and with it SGLang's model code) fails at load time, although
 * with SGLANG_USE_CPU_ENGINE=1 and the torch_native attention backend none of its kernels runs.
 * This library exports the driver symbols those objects import (`nm -D --undefined-only`), each
 * answering CUDA_ERROR_NO_DEVICE, so they load and every layer takes its torch path.
 *
 * Built and loaded by megatron_dapo/rollout/sglang_cpu.py (scripts/setup_env.sh builds it): only
 * into a CPU engine's processes, and never where a real driver library loads. */
#include <stddef.h>

typedef int CUresult;
#define CUDA_ERROR_NO_DEVICE 100

/* How sglang_cpu.py tells this library from a real driver that happens to be on the path. */
const char megatron_dapo_cuda_driver_stub[] = "megatron-dapo CPU test-bench stub of libcuda.so.1";

CUresult cuGetErrorString(CUresult error, const char **str) {
    (void)error;
    if (str) *str = "no CUDA device (megatron-dapo's CPU stub of the driver library)";
    return 0;
}

CUresult cuGetErrorName(CUresult error, const char **str) {
    (void)error;
    if (str) *str = "CUDA_ERROR_NO_DEVICE";
    return 0;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, unsigned long long flags, int *status) {
    (void)symbol; (void)version; (void)flags;
    if (fn) *fn = NULL;
    if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return CUDA_ERROR_NO_DEVICE;
}

/* Every other imported entry point: no device. Arguments are ignored (under the x86-64 C calling
 * convention a function that takes none may be called with any). */
#define NO_DEVICE(name) CUresult name(void) { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuInit)
NO_DEVICE(cuDriverGetVersion)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetCount)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDeviceGetDevResource)
NO_DEVICE(cuDevSmResourceSplitByCount)
NO_DEVICE(cuDevResourceGenerateDesc)
NO_DEVICE(cuGreenCtxCreate)
NO_DEVICE(cuGreenCtxDestroy)
NO_DEVICE(cuGreenCtxGetDevResource)
NO_DEVICE(cuCtxFromGreenCtx)
NO_DEVICE(cuCtxPushCurrent_v2)
NO_DEVICE(cuCtxPopCurrent_v2)
NO_DEVICE(cuCtxGetCurrent)
NO_DEVICE(cuStreamCreate)
NO_DEVICE(cuPointerGetAttribute)
