// kiln's generic Triton kernel launch: one C function for every kernel signature.
//
// Triton launches a compiled kernel through a C extension it writes for the kernel's argument
// types and builds with gcc (a 0.3-0.4 s run on the H200 host, one per distinct signature: ten
// for a six-layer GPT's training step, the longest part of its parallel compile). This launch
// reads the types from a string of one-letter codes instead, so nothing is built per kernel.
// It takes exactly the arguments of Triton's `launch` (triton_native_launcher.py binds the
// codes): grid, stream, function, cooperative/PDL flags, scratch buffers, the packed metadata
// (num_warps, num_ctas, shared memory), launch metadata, enter/exit hooks, then one argument
// per entry of the kernel's signature; the kernel's parameters are the non-constexpr ones
// followed by the global and profile scratch pointers (Triton 3.6's layout).
//
// Codes: p pointer, b/B int8/uint8, h/H int16/uint16, i/I int32/uint32, l/L int64/uint64,
// e fp16, a bf16, f fp32, d fp64, c constexpr (not a kernel parameter).
// The CUDA driver is opened with dlopen, as Triton's launcher does: no CUDA headers or
// libraries are needed to build this, and a machine without a GPU never calls it.
#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>

namespace {

typedef int CUresult;
typedef void* CUcontext;
typedef void* CUfunction;
typedef void* CUstream;
typedef int CUdevice;

typedef CUresult (*LaunchFn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
typedef CUresult (*CtxGetCurrentFn)(CUcontext*);
typedef CUresult (*DeviceGetFn)(CUdevice*, int);
typedef CUresult (*PrimaryCtxRetainFn)(CUcontext*, CUdevice);
typedef CUresult (*CtxSetCurrentFn)(CUcontext);
typedef CUresult (*GetErrorStringFn)(CUresult, const char**);

struct Driver {
  LaunchFn launch = nullptr;
  CtxGetCurrentFn ctx_get_current = nullptr;
  DeviceGetFn device_get = nullptr;
  PrimaryCtxRetainFn primary_ctx_retain = nullptr;
  CtxSetCurrentFn ctx_set_current = nullptr;
  GetErrorStringFn get_error_string = nullptr;
};

Driver driver;
constexpr Py_ssize_t kFixedArgs = 14;  // codes + Triton's 13 launch arguments
constexpr Py_ssize_t kMaxParams = 512;

bool open_driver() {
  if (driver.launch != nullptr) return true;
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (lib == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "kiln launch: cannot open libcuda.so.1");
    return false;
  }
  Driver d;
  d.launch = (LaunchFn)dlsym(lib, "cuLaunchKernel");
  d.ctx_get_current = (CtxGetCurrentFn)dlsym(lib, "cuCtxGetCurrent");
  d.device_get = (DeviceGetFn)dlsym(lib, "cuDeviceGet");
  d.primary_ctx_retain = (PrimaryCtxRetainFn)dlsym(lib, "cuDevicePrimaryCtxRetain");
  d.ctx_set_current = (CtxSetCurrentFn)dlsym(lib, "cuCtxSetCurrent");
  d.get_error_string = (GetErrorStringFn)dlsym(lib, "cuGetErrorString");
  if (!d.launch || !d.ctx_get_current || !d.device_get || !d.primary_ctx_retain ||
      !d.ctx_set_current || !d.get_error_string) {
    PyErr_SetString(PyExc_RuntimeError, "kiln launch: libcuda.so.1 lacks a driver entry point");
    return false;
  }
  driver = d;
  return true;
}

bool check(CUresult status, const char* what) {
  if (status == 0) return true;
  const char* text = nullptr;
  driver.get_error_string(status, &text);
  PyErr_Format(PyExc_RuntimeError, "kiln launch: %s failed: %s", what,
               text ? text : "unknown CUDA error");
  return false;
}

// As Triton's launcher: a thread with no current context gets device 0's primary context.
bool ensure_context() {
  CUcontext ctx = nullptr;
  if (!check(driver.ctx_get_current(&ctx), "cuCtxGetCurrent")) return false;
  if (ctx != nullptr) return true;
  CUdevice device;
  return check(driver.device_get(&device, 0), "cuDeviceGet") &&
         check(driver.primary_ctx_retain(&ctx, device), "cuDevicePrimaryCtxRetain") &&
         check(driver.ctx_set_current(ctx), "cuCtxSetCurrent");
}

// A pointer argument: an address (int), None (null), or an object with data_ptr().
bool read_pointer(PyObject* obj, uint64_t* out) {
  if (obj == Py_None) {
    *out = 0;
    return true;
  }
  if (PyLong_Check(obj)) {
    *out = PyLong_AsUnsignedLongLong(obj);
    return !PyErr_Occurred();
  }
  PyObject* ptr = PyObject_CallMethod(obj, "data_ptr", nullptr);
  if (ptr == nullptr) return false;
  *out = PyLong_AsUnsignedLongLong(ptr);
  Py_DECREF(ptr);
  return !PyErr_Occurred();
}

// Bytes of an integer parameter. Its slot takes the low bytes of the 64-bit value, which on a
// little-endian machine (every CUDA host) are the value cast to that width.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "kiln launch packs little-endian");
size_t int_width(char code) {
  switch (code) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': return 2;
    case 'i': case 'I': return 4;
    default: return 8;
  }
}

// One argument into its parameter slot, by code; false with a Python error set.
bool pack(char code, PyObject* obj, uint64_t* slot) {
  *slot = 0;
  switch (code) {
    case 'p':
      return read_pointer(obj, slot);
    case 'b': case 'h': case 'i': case 'l': {
      long long v = PyLong_AsLongLong(obj);
      if (v == -1 && PyErr_Occurred()) return false;
      std::memcpy(slot, &v, int_width(code));  // the low bytes: the value cast to that width
      return true;
    }
    case 'B': case 'H': case 'I': case 'L': {
      unsigned long long v = PyLong_AsUnsignedLongLongMask(obj);
      if (v == (unsigned long long)-1 && PyErr_Occurred()) return false;
      std::memcpy(slot, &v, int_width(code));
      return true;
    }
    case 'e': case 'a': case 'f': case 'd': {
      double v = PyFloat_AsDouble(obj);
      if (v == -1.0 && PyErr_Occurred()) return false;
      if (code == 'd') {
        std::memcpy(slot, &v, 8);
      } else if (code == 'e') {
        if (PyFloat_Pack2(v, (char*)slot, 1) < 0) return false;
      } else {
        float f = (float)v;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (code == 'a') {
          uint16_t top = (uint16_t)(bits >> 16);  // as Triton's launcher packs bf16
          std::memcpy(slot, &top, 2);
        } else {
          std::memcpy(slot, &bits, 4);
        }
      }
      return true;
    }
    default:
      PyErr_Format(PyExc_ValueError, "kiln launch: unknown argument code %c", code);
      return false;
  }
}

bool call_hook(PyObject* hook, PyObject* metadata) {
  if (hook == Py_None) return true;
  PyObject* ret = PyObject_CallOneArg(hook, metadata);
  if (ret == nullptr) return false;
  Py_DECREF(ret);
  return true;
}

PyObject* launch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < kFixedArgs || !PyBytes_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "kiln launch: launch(codes, grid..., *kernel_args)");
    return nullptr;
  }
  const char* codes = PyBytes_AS_STRING(args[0]);
  Py_ssize_t n = PyBytes_GET_SIZE(args[0]);
  if (nargs != kFixedArgs + n || n > kMaxParams) {
    PyErr_Format(PyExc_TypeError, "kiln launch: %zd kernel arguments for a signature of %zd",
                 nargs - kFixedArgs, n);
    return nullptr;
  }
  unsigned grid[3];
  for (int k = 0; k < 3; k++) {
    long g = PyLong_AsLong(args[1 + k]);
    if (g == -1 && PyErr_Occurred()) return nullptr;
    grid[k] = (unsigned)g;
  }
  uint64_t stream = PyLong_AsUnsignedLongLong(args[4]);
  uint64_t function = PyLong_AsUnsignedLongLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  if (PyObject_IsTrue(args[6]) || PyObject_IsTrue(args[7])) {
    PyErr_SetString(PyExc_ValueError,
                    "kiln launch: cooperative and PDL launches go through Triton's launcher");
    return nullptr;
  }
  int num_warps, num_ctas, shared;
  if (!PyArg_ParseTuple(args[10], "iii", &num_warps, &num_ctas, &shared)) return nullptr;
  if (num_ctas != 1) {
    PyErr_SetString(PyExc_ValueError, "kiln launch: clusters go through Triton's launcher");
    return nullptr;
  }
  if (!open_driver() || !call_hook(args[12], args[11])) return nullptr;
  uint64_t slots[kMaxParams + 2];
  void* params[kMaxParams + 2];
  int count = 0;
  for (Py_ssize_t k = 0; k < n; k++) {
    if (codes[k] == 'c') continue;
    if (!pack(codes[k], args[kFixedArgs + k], &slots[count])) return nullptr;
    params[count] = &slots[count];
    count++;
  }
  for (int k = 0; k < 2; k++) {  // the global and profile scratch pointers
    if (!read_pointer(args[8 + k], &slots[count])) return nullptr;
    params[count] = &slots[count];
    count++;
  }
  if (grid[0] * grid[1] * grid[2] > 0) {
    CUresult status = 0;
    if (!ensure_context()) return nullptr;
    Py_BEGIN_ALLOW_THREADS;
    status = driver.launch((CUfunction)function, grid[0], grid[1], grid[2], 32 * num_warps, 1, 1,
                           shared, (CUstream)stream, params, nullptr);
    Py_END_ALLOW_THREADS;
    if (!check(status, "cuLaunchKernel")) return nullptr;
  }
  if (!call_hook(args[13], args[11])) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace

PyMethodDef kiln_launch_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(codes, gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch, "
     "profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)"},
    {nullptr, nullptr, 0, nullptr}};
