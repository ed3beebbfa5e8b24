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

#include <cstddef>
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

// The launch itself, once the parameters are packed (an empty grid launches nothing); false
// with a Python error set. The driver must be open.
bool cuda_launch(uint64_t function, const unsigned grid[3], int num_warps, int shared,
                 uint64_t stream, void** params) {
  if (grid[0] * grid[1] * grid[2] == 0) return true;
  if (!ensure_context()) return false;
  CUresult status = 0;
  Py_BEGIN_ALLOW_THREADS;
  status = driver.launch((CUfunction)function, grid[0], grid[1], grid[2], 32 * num_warps, 1, 1,
                         shared, (CUstream)stream, params, nullptr);
  Py_END_ALLOW_THREADS;
  return check(status, "cuLaunchKernel");
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
  if (nargs != kFixedArgs + n) {
    PyErr_Format(PyExc_TypeError, "kiln launch: %zd kernel arguments for a signature of %zd",
                 nargs - kFixedArgs, n);
    return nullptr;
  }
  if (n > kMaxParams) {
    PyErr_Format(PyExc_ValueError,
                 "kiln launch: a signature of %zd parameters, more than the %zd this launch "
                 "packs (triton_native_launcher.MAX_PARAMS gives such kernels Triton's launcher)",
                 n, kMaxParams);
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
  if (!cuda_launch(function, grid, num_warps, shared, stream, params)) return nullptr;
  if (!call_hook(args[13], args[11])) return nullptr;
  Py_RETURN_NONE;
}

// -- bound launches -------------------------------------------------------------------------
//
// A kernel launched again and again from one line of a wrapper program, at one grid:
// `kernel3[(6272,)](buf0, arg1, buf2, XBLOCK=1024, num_warps=2)`, or with the size arguments of
// a kernel compiled for symbolic sizes, `kernel0[(g,)](arg0, buf1, s0, XBLOCK=1024, ...)`.
// Everything but the tensors' addresses, the sizes and the current stream is known after its
// first launch, so `bind_launch` keeps it in a `BoundLaunch`, which the wrapper calls directly
// (triton_launch.FastKernel). A call reads each tensor's address (`Tensor.data_ptr`), packs each
// size by the kernel's code for it, asks torch for the current stream and launches; it costs a
// fraction of the Python path (ResNet-50 at batch 32: 50 launches a call, 7.6 us each through
// `_Launch.__call__` on the H200 host). Anything it is not sure of goes to `fallback`, the Python
// `_Launch` with the same arguments: an address that is not 16-byte aligned or a size of another
// specialization class than the first launch's (the kernel was specialized on both: see
// `int_class`), a launch hook set (profilers), other keyword arguments than the call site's
// first ones, other than `nparams` positional ones, or an argument of another kind than the
// first launch's (a tensor where a size was, a bool or float for an int).

struct BoundLaunch {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fallback;   // the Python launch: same arguments, every case
  PyObject* data_ptr;   // torch.Tensor.data_ptr
  PyObject* stream_of;  // torch._C._cuda_getCurrentRawStream
  PyObject* device;     // its argument: the kernel's device index
  PyObject* knobs;      // triton.knobs.runtime, whose launch hooks are read on every call
  PyObject* kwnames;    // the call site's keyword names and values, from the first call
  PyObject* kwvalues;
  PyObject* codes;      // bytes: per positional argument its code ('p' or an integer code)
  PyObject* classes;    // bytes: per integer argument the `int_class` it was compiled for
  uint64_t function;
  unsigned grid[3];
  int num_warps, shared;
  Py_ssize_t nparams;
  bool pointers_only;   // every argument a tensor: the loop without codes
};

PyObject* str_calls = nullptr;
PyObject* str_enter = nullptr;
PyObject* str_exit = nullptr;

// `not getattr(hook, "calls", hook)`, as triton_launch._no_hooks: no hook is set.
bool hook_empty(PyObject* knobs, PyObject* name) {
  PyObject* hook = PyObject_GetAttr(knobs, name);
  if (hook == nullptr) {
    PyErr_Clear();
    return false;
  }
  PyObject* calls = hook == Py_None ? nullptr : PyObject_GetAttr(hook, str_calls);
  if (calls == nullptr) PyErr_Clear();
  int set = hook == Py_None ? 0 : PyObject_IsTrue(calls != nullptr ? calls : hook);
  Py_XDECREF(calls);
  Py_DECREF(hook);
  if (set < 0) PyErr_Clear();
  return set == 0;
}

// The same keyword arguments as the first call's: the same names and the same value objects (the
// wrapper's line passes constants, so they are). The first call records them and says no.
bool same_keywords(BoundLaunch* self, PyObject* const* values, PyObject* kwnames) {
  Py_ssize_t n = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  if (self->kwvalues == nullptr) {
    PyObject* kept = PyTuple_New(n);
    if (kept == nullptr) {
      PyErr_Clear();
      return false;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
      Py_INCREF(values[k]);
      PyTuple_SET_ITEM(kept, k, values[k]);
    }
    Py_XINCREF(kwnames);
    self->kwnames = kwnames;
    self->kwvalues = kept;
    return false;
  }
  if (kwnames != self->kwnames) {  // a call through `**kwargs` makes a new tuple of the names
    if (kwnames == nullptr || self->kwnames == nullptr || n != PyTuple_GET_SIZE(self->kwnames))
      return false;
    for (Py_ssize_t k = 0; k < n; k++) {  // interned: the same string objects
      if (PyTuple_GET_ITEM(kwnames, k) != PyTuple_GET_ITEM(self->kwnames, k)) return false;
    }
  }
  for (Py_ssize_t k = 0; k < n; k++) {
    if (values[k] != PyTuple_GET_ITEM(self->kwvalues, k)) return false;
  }
  return true;
}

// What Triton 3.6 specializes an integer argument on (jit.py's `specialize_impl`, checked
// against triton_cached.int_class): bit 0 equal to 1 (then a constexpr of the kernel, not a
// parameter), bit 1 divisible by 16, bits 2-3 the type it is passed as (0 i32, 1 i64, 2 u64).
// -1: not an int Triton passes as an integer (a bool, a float, an int subclass, past 64 bits).
// `*bits` gets the value's 64 bits, whose low bytes are its slot (see `pack`).
int int_class(PyObject* obj, uint64_t* bits) {
  if (!PyLong_CheckExact(obj)) return -1;
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  if (overflow == 0) {
    std::memcpy(bits, &v, 8);
    int width = v >= INT32_MIN && v <= INT32_MAX ? 0 : 1;
    return (v == 1) | ((v % 16 == 0) << 1) | (width << 2);
  }
  if (overflow < 0) return -1;
  unsigned long long u = PyLong_AsUnsignedLongLong(obj);
  if (u == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  *bits = u;
  return ((u % 16 == 0) << 1) | (2 << 2);
}

// One tensor argument's address into `slot`; false (no error set) when it has none.
inline bool address(BoundLaunch* self, PyObject* const* arg, uint64_t* slot) {
  PyObject* ptr = PyObject_Vectorcall(self->data_ptr, arg, 1, nullptr);
  if (ptr == nullptr) {
    PyErr_Clear();
    return false;
  }
  *slot = PyLong_AsUnsignedLongLong(ptr);
  Py_DECREF(ptr);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

// 1: launched; 0: not this path (the fallback takes it, no error set); -1: a CUDA error.
int bound_launch(BoundLaunch* self, PyObject* const* args) {
  uint64_t slots[kMaxParams + 2];
  void* params[kMaxParams + 2];
  uint64_t any = 0;
  Py_ssize_t n = self->nparams, count = 0;
  if (self->pointers_only) {  // the common case, kept free of per-argument codes
    for (Py_ssize_t k = 0; k < n; k++) {
      if (!address(self, &args[k], &slots[k])) return 0;
      any |= slots[k];
      params[k] = &slots[k];
    }
    count = n;
  } else {
    const char* codes = PyBytes_AS_STRING(self->codes);
    const char* classes = PyBytes_AS_STRING(self->classes);
    for (Py_ssize_t k = 0; k < n; k++) {
      uint64_t* slot = &slots[count];
      if (codes[k] == 'p') {
        if (!address(self, &args[k], slot)) return 0;
        any |= *slot;
      } else {
        uint64_t bits = 0;
        if (int_class(args[k], &bits) != classes[k]) return 0;  // another compiled variant
        if (codes[k] == 'c') continue;  // the constant 1 of the kernel: no parameter
        *slot = 0;
        std::memcpy(slot, &bits, int_width(codes[k]));
      }
      params[count] = slot;
      count++;
    }
  }
  if (any & 15) return 0;  // compiled for 16-byte aligned pointers
  for (int k = 0; k < 2; k++) {  // no global or profile scratch
    slots[count + k] = 0;
    params[count + k] = &slots[count + k];
  }
  PyObject* s = PyObject_Vectorcall(self->stream_of, &self->device, 1, nullptr);
  if (s == nullptr) return -1;
  uint64_t stream = PyLong_AsUnsignedLongLong(s);
  Py_DECREF(s);
  if (PyErr_Occurred()) return -1;
  if (self->grid[0] * self->grid[1] * self->grid[2] > 0 && !open_driver()) return -1;
  return cuda_launch(self->function, self->grid, self->num_warps, self->shared, stream, params)
             ? 1
             : -1;
}

PyObject* bound_call(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  BoundLaunch* self = (BoundLaunch*)callable;
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n == self->nparams && same_keywords(self, args + n, kwnames) &&
      hook_empty(self->knobs, str_enter) && hook_empty(self->knobs, str_exit)) {
    int done = bound_launch(self, args);
    if (done > 0) Py_RETURN_NONE;
    if (done < 0) return nullptr;
  }
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

void bound_dealloc(PyObject* obj) {
  BoundLaunch* self = (BoundLaunch*)obj;
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->data_ptr);
  Py_XDECREF(self->stream_of);
  Py_XDECREF(self->device);
  Py_XDECREF(self->knobs);
  Py_XDECREF(self->kwnames);
  Py_XDECREF(self->kwvalues);
  Py_XDECREF(self->codes);
  Py_XDECREF(self->classes);
  Py_TYPE(obj)->tp_free(obj);
}

PyTypeObject BoundLaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

bool ready_type() {
  if (BoundLaunchType.tp_flags & Py_TPFLAGS_READY) return true;
  str_calls = PyUnicode_InternFromString("calls");
  str_enter = PyUnicode_InternFromString("launch_enter_hook");
  str_exit = PyUnicode_InternFromString("launch_exit_hook");
  if (!str_calls || !str_enter || !str_exit) return false;
  BoundLaunchType.tp_name = "kiln_native.BoundLaunch";
  BoundLaunchType.tp_doc = "a kernel launch bound to its grid and kernel (see native_launch.cpp)";
  BoundLaunchType.tp_basicsize = sizeof(BoundLaunch);
  BoundLaunchType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  BoundLaunchType.tp_vectorcall_offset = offsetof(BoundLaunch, vectorcall);
  BoundLaunchType.tp_call = PyVectorcall_Call;
  BoundLaunchType.tp_dealloc = bound_dealloc;
  return PyType_Ready(&BoundLaunchType) == 0;
}

// bind_launch(fallback, function, gridX, gridY, gridZ, num_warps, shared, codes, classes,
//             device, data_ptr, stream_of, knobs): `codes` (bytes) has one code per positional
// argument, 'p' for a tensor or an integer code of native_launch's ('c' for a size the kernel
// took as the constant 1); `classes` (bytes, as long) the `int_class` each integer argument
// was compiled for (ignored under 'p').
PyObject* bind_launch(PyObject*, PyObject* args) {
  PyObject *fallback, *codes, *classes, *device, *data_ptr, *stream_of, *knobs;
  unsigned long long function;
  unsigned g0, g1, g2;
  int num_warps, shared;
  if (!PyArg_ParseTuple(args, "OKIIIiiSSOOOO", &fallback, &function, &g0, &g1, &g2, &num_warps,
                        &shared, &codes, &classes, &device, &data_ptr, &stream_of, &knobs)) {
    return nullptr;
  }
  Py_ssize_t nparams = PyBytes_GET_SIZE(codes);
  if (nparams > kMaxParams) {
    PyErr_Format(PyExc_ValueError, "bind_launch: %zd parameters (at most %zd)", nparams,
                 kMaxParams);
    return nullptr;
  }
  if (PyBytes_GET_SIZE(classes) != nparams) {
    PyErr_Format(PyExc_ValueError, "bind_launch: %zd classes for %zd codes",
                 PyBytes_GET_SIZE(classes), nparams);
    return nullptr;
  }
  const char* code = PyBytes_AS_STRING(codes);
  const char* cls = PyBytes_AS_STRING(classes);
  bool pointers_only = true;
  for (Py_ssize_t k = 0; k < nparams; k++) {
    if (code[k] == 'p') continue;
    pointers_only = false;
    if (std::strchr("cbBhHiIlL", code[k]) == nullptr || code[k] == '\0') {
      PyErr_Format(PyExc_ValueError,
                   "bind_launch: argument %zd has code %c, not a pointer or an integer", k,
                   code[k]);
      return nullptr;
    }
    if (cls[k] < 0 || cls[k] > 11 || (code[k] == 'c' && !(cls[k] & 1))) {
      PyErr_Format(PyExc_ValueError,
                   "bind_launch: argument %zd: class %d does not fit code %c (a constexpr "
                   "size is exactly the constant 1)",
                   k, (int)cls[k], code[k]);
      return nullptr;
    }
  }
  if (!ready_type()) return nullptr;
  BoundLaunch* self = PyObject_New(BoundLaunch, &BoundLaunchType);
  if (self == nullptr) return nullptr;
  self->vectorcall = bound_call;
  PyObject* held[] = {fallback, data_ptr, stream_of, device, knobs, codes, classes};
  for (PyObject* o : held) Py_INCREF(o);
  self->fallback = fallback;
  self->data_ptr = data_ptr;
  self->stream_of = stream_of;
  self->device = device;
  self->knobs = knobs;
  self->codes = codes;
  self->classes = classes;
  self->kwnames = self->kwvalues = nullptr;
  self->function = function;
  self->grid[0] = g0;
  self->grid[1] = g1;
  self->grid[2] = g2;
  self->num_warps = num_warps;
  self->shared = shared;
  self->nparams = nparams;
  self->pointers_only = pointers_only;
  return (PyObject*)self;
}

}  // namespace

PyMethodDef kiln_launch_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(codes, gridX, gridY, gridZ, stream, function, cooperative, pdl, global_scratch, "
     "profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)"},
    {"bind_launch", bind_launch, METH_VARARGS,
     "bind_launch(fallback, function, gridX, gridY, gridZ, num_warps, shared, codes, classes, "
     "device, data_ptr, stream_of, knobs) -> BoundLaunch"},
    {nullptr, nullptr, 0, nullptr}};
