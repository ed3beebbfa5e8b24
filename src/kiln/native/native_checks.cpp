// kiln's native checks: tables of held facts checked in one C++ call, and tensor addresses
// read in one C++ call. Built and loaded by native.py, which also holds the Python versions
// these must agree with exactly (a failed read is a failed check, never an error).
//
// Why: a large model's entry guards check every parameter and buffer on every call (ResNet-50:
// 267 tensors, six Python attribute reads each, ~1 us a tensor); torch.compile checks the same
// facts in C++. Here one call walks a table prepared once, reading the TensorImpl directly.
#include <Python.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <exception>
#include <optional>
#include <vector>

namespace {

enum Kind { TENSORS, ITEMS, DICTS, EMPTY };

struct TensorRow {
  PyObject* obj;
  PyTypeObject* type;
  c10::ScalarType dtype;
  c10::Device device;
  std::vector<int64_t> sizes, strides;
  bool requires_grad;
};

struct Table {
  Kind kind;
  std::vector<PyObject*> owned;  // strong references to everything below, released with it
  std::vector<TensorRow> tensors;
  std::vector<std::vector<PyObject*>> rows;  // ITEMS: dict, key, type, value; DICTS: obj, dict;
                                             // EMPTY: dict
  std::vector<PyObject*> names;  // EMPTY: the keys whose values must all be falsy
  ~Table() {
    for (PyObject* o : owned) Py_DECREF(o);
  }
  PyObject* own(PyObject* o) {
    Py_INCREF(o);
    owned.push_back(o);
    return o;
  }
};

PyObject* dict_name = nullptr;  // "__dict__", interned

bool check_tensors(const Table& t) {
  for (const TensorRow& r : t.tensors) {
    if (Py_TYPE(r.obj) != r.type) return false;
    const at::Tensor& x = THPVariable_Unpack(r.obj);
    if (x.scalar_type() != r.dtype || x.device() != r.device) return false;
    if (x.requires_grad() != r.requires_grad) return false;
    if (!x.sizes().equals(r.sizes) || !x.strides().equals(r.strides)) return false;
  }
  return true;
}

bool check_items(const Table& t) {  // type(d[k]) is T and d[k] == v
  for (const auto& r : t.rows) {
    PyObject* v = PyDict_GetItemWithError(r[0], r[1]);
    if (v == nullptr || (PyObject*)Py_TYPE(v) != r[2]) return false;
    Py_INCREF(v);
    int eq = PyObject_RichCompareBool(v, r[3], Py_EQ);
    Py_DECREF(v);
    if (eq != 1) return false;
  }
  return true;
}

bool check_dicts(const Table& t) {  // obj.__dict__ is d
  for (const auto& r : t.rows) {
    PyObject* d = PyObject_GetAttr(r[0], dict_name);
    if (d == nullptr) return false;
    Py_DECREF(d);  // `r[1]` holds the dictionary, so comparing the address after is sound
    if (d != r[1]) return false;
  }
  return true;
}

bool check_empty(const Table& t) {  // not (d[n0] or d[n1] or ...)
  for (const auto& r : t.rows) {
    for (PyObject* name : t.names) {
      PyObject* v = PyDict_GetItemWithError(r[0], name);
      if (v == nullptr || PyObject_IsTrue(v) != 0) return false;
    }
  }
  return true;
}

void destroy(PyObject* capsule) {
  delete static_cast<Table*>(PyCapsule_GetPointer(capsule, "kiln.table"));
}

PyObject* check(PyObject* capsule, PyObject*) {
  const Table* t = static_cast<Table*>(PyCapsule_GetPointer(capsule, "kiln.table"));
  bool ok = false;
  try {
    switch (t->kind) {
      case TENSORS: ok = check_tensors(*t); break;
      case ITEMS: ok = check_items(*t); break;
      case DICTS: ok = check_dicts(*t); break;
      case EMPTY: ok = check_empty(*t); break;
    }
  } catch (const std::exception&) {
    ok = false;  // a tensor whose sizes or strides cannot be read (as in Python: a miss)
  }
  if (PyErr_Occurred()) PyErr_Clear();  // a failed lookup or comparison is a miss
  if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyMethodDef check_def = {"check", check, METH_NOARGS, "True when every row of the table holds."};

std::vector<int64_t> ints(PyObject* seq) {
  std::vector<int64_t> out;
  Py_ssize_t n = PyTuple_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) out.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i)));
  return out;
}

bool tuple_of(PyObject* row, Py_ssize_t n) { return PyTuple_Check(row) && PyTuple_GET_SIZE(row) == n; }

// prepare(kind, rows, names) -> a callable taking no arguments that checks the table.
// Rows are validated here, so `check` trusts their shapes.
PyObject* prepare(PyObject*, PyObject* args) {
  const char* kind;
  PyObject *rows, *names;
  if (!PyArg_ParseTuple(args, "sO!O!", &kind, &PyTuple_Type, &rows, &PyTuple_Type, &names))
    return nullptr;
  auto* t = new Table();
  std::string k(kind);
  Py_ssize_t n = PyTuple_GET_SIZE(rows);
  const char* bad = nullptr;
  if (k == "tensors") {
    t->kind = TENSORS;  // (tensor, type, dtype, device, sizes, strides, requires_grad)
    for (Py_ssize_t i = 0; i < n && !bad; ++i) {
      PyObject* r = PyTuple_GET_ITEM(rows, i);
      if (!tuple_of(r, 7) || !THPVariable_CheckExact(PyTuple_GET_ITEM(r, 0)) ||
          !PyType_Check(PyTuple_GET_ITEM(r, 1)) || !THPDtype_Check(PyTuple_GET_ITEM(r, 2)) ||
          !THPDevice_Check(PyTuple_GET_ITEM(r, 3)) || !PyTuple_Check(PyTuple_GET_ITEM(r, 4)) ||
          !PyTuple_Check(PyTuple_GET_ITEM(r, 5)) || !PyBool_Check(PyTuple_GET_ITEM(r, 6))) {
        bad = "a tensor row is (tensor, type, dtype, device, sizes, strides, requires_grad)";
        break;
      }
      TensorRow row{t->own(PyTuple_GET_ITEM(r, 0)),
                    (PyTypeObject*)t->own(PyTuple_GET_ITEM(r, 1)),
                    ((THPDtype*)PyTuple_GET_ITEM(r, 2))->scalar_type,
                    ((THPDevice*)PyTuple_GET_ITEM(r, 3))->device,
                    ints(PyTuple_GET_ITEM(r, 4)),
                    ints(PyTuple_GET_ITEM(r, 5)),
                    PyTuple_GET_ITEM(r, 6) == Py_True};
      t->tensors.push_back(std::move(row));
    }
  } else {
    Py_ssize_t width, dict_at;
    if (k == "items") {
      t->kind = ITEMS, width = 4, dict_at = 0;
    } else if (k == "dicts") {
      t->kind = DICTS, width = 2, dict_at = 1;
    } else if (k == "empty") {
      t->kind = EMPTY, width = 2, dict_at = 1;
    } else {
      delete t;
      return PyErr_Format(PyExc_ValueError, "unknown table kind %s", kind);
    }
    for (Py_ssize_t i = 0; i < n && !bad; ++i) {
      PyObject* r = PyTuple_GET_ITEM(rows, i);
      if (!tuple_of(r, width) || !PyDict_CheckExact(PyTuple_GET_ITEM(r, dict_at))) {
        bad = "a row has the wrong width, or no plain dict where one belongs";
        break;
      }
      std::vector<PyObject*> row;
      for (Py_ssize_t j = 0; j < width; ++j) row.push_back(t->own(PyTuple_GET_ITEM(r, j)));
      if (t->kind == EMPTY) row = {row[1]};
      t->rows.push_back(std::move(row));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); ++i)
      t->names.push_back(t->own(PyTuple_GET_ITEM(names, i)));
  }
  if (bad || PyErr_Occurred()) {
    delete t;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, bad);
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(t, "kiln.table", destroy);
  if (capsule == nullptr) {
    delete t;
    return nullptr;
  }
  PyObject* fn = PyCFunction_New(&check_def, capsule);
  Py_DECREF(capsule);
  return fn;
}

// A fetched tensor's facts (a guard whose tensor is read through a list or a dict on every
// call, not held: an optimizer's parameters and state): the TensorRow without its object.
struct Spec {
  PyObject* type;  // owned
  TensorRow row;
  ~Spec() { Py_XDECREF(type); }
};

void destroy_spec(PyObject* capsule) {
  delete static_cast<Spec*>(PyCapsule_GetPointer(capsule, "kiln.spec"));
}

PyObject* check_spec(PyObject* capsule, PyObject* x) {
  const Spec* s = static_cast<Spec*>(PyCapsule_GetPointer(capsule, "kiln.spec"));
  const TensorRow& r = s->row;
  bool ok = false;
  if (Py_TYPE(x) == r.type) {  // an exact torch.Tensor or Parameter (prepare_spec checks)
    try {
      const at::Tensor& t = THPVariable_Unpack(x);
      ok = t.scalar_type() == r.dtype && t.device() == r.device &&
           t.requires_grad() == r.requires_grad && t.sizes().equals(r.sizes) &&
           t.strides().equals(r.strides);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (PyErr_Occurred()) PyErr_Clear();
  if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyMethodDef check_spec_def = {"check", check_spec, METH_O,
                              "True when the tensor has the spec's type, dtype, device, sizes, "
                              "strides and requires_grad."};

// prepare_spec((type, dtype, device, sizes, strides, requires_grad)) -> check(tensor)
PyObject* prepare_spec(PyObject*, PyObject* r) {
  if (!tuple_of(r, 6) || !PyType_Check(PyTuple_GET_ITEM(r, 0)) ||
      !THPDtype_Check(PyTuple_GET_ITEM(r, 1)) || !THPDevice_Check(PyTuple_GET_ITEM(r, 2)) ||
      !PyTuple_Check(PyTuple_GET_ITEM(r, 3)) || !PyTuple_Check(PyTuple_GET_ITEM(r, 4)) ||
      !PyBool_Check(PyTuple_GET_ITEM(r, 5))) {
    PyErr_SetString(PyExc_ValueError,
                    "a spec is (type, dtype, device, sizes, strides, requires_grad)");
    return nullptr;
  }
  PyObject* type = PyTuple_GET_ITEM(r, 0);
  if (!THPVariable_CheckTypeExact((PyTypeObject*)type)) {
    PyErr_SetString(PyExc_ValueError, "a spec's type is torch.Tensor or torch.nn.Parameter");
    return nullptr;
  }
  auto* s = new Spec{nullptr, TensorRow{nullptr, (PyTypeObject*)type,
                                        ((THPDtype*)PyTuple_GET_ITEM(r, 1))->scalar_type,
                                        ((THPDevice*)PyTuple_GET_ITEM(r, 2))->device,
                                        ints(PyTuple_GET_ITEM(r, 3)), ints(PyTuple_GET_ITEM(r, 4)),
                                        PyTuple_GET_ITEM(r, 5) == Py_True}};
  Py_INCREF(type);
  s->type = type;
  if (PyErr_Occurred()) {
    delete s;
    return nullptr;
  }
  PyObject* capsule = PyCapsule_New(s, "kiln.spec", destroy_spec);
  if (capsule == nullptr) {
    delete s;
    return nullptr;
  }
  PyObject* fn = PyCFunction_New(&check_spec_def, capsule);
  Py_DECREF(capsule);
  return fn;
}

// data_ptrs(seq) -> tuple of each item's data_ptr(), read in C++ for a Tensor or Parameter
// and called through Python for anything else (so a non-tensor raises what Python raises).
PyObject* data_ptrs(PyObject*, PyObject* seq) {
  PyObject* fast = PySequence_Fast(seq, "data_ptrs takes a sequence of tensors");
  if (fast == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject* out = PyTuple_New(n);
  for (Py_ssize_t i = 0; out != nullptr && i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    PyObject* ptr = nullptr;
    if (THPVariable_CheckExact(item)) {  // a Tensor or Parameter
      try {
        ptr = PyLong_FromVoidPtr(THPVariable_Unpack(item).data_ptr());
      } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      }
    } else {  // anything else answers as in Python (a subclass may override data_ptr)
      ptr = PyObject_CallMethod(item, "data_ptr", nullptr);
    }
    if (ptr == nullptr) {
      Py_CLEAR(out);
      break;
    }
    PyTuple_SET_ITEM(out, i, ptr);
  }
  Py_DECREF(fast);
  return out;
}

bool int_list(PyObject* seq, std::vector<int64_t>& out) {
  PyObject* fast = PySequence_Fast(seq, "as_strided: size and stride are sequences of ints");
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

// as_strided(base, size, stride[, offset]) -> torch.as_strided(base, size, stride, offset), the
// same dispatcher call (views, autograd, version counters alike) without Python's argument
// parsing: a compiled GPT-2 forward's wrapper makes ~90 of these a call.
PyObject* as_strided(PyObject*, PyObject* args) {
  PyObject *base, *size, *stride, *offset = Py_None;
  if (!PyArg_ParseTuple(args, "OOO|O", &base, &size, &stride, &offset)) return nullptr;
  if (!THPVariable_Check(base)) {
    PyErr_SetString(PyExc_TypeError, "as_strided: the base must be a Tensor");
    return nullptr;
  }
  std::vector<int64_t> sizes, strides;
  if (!int_list(size, sizes) || !int_list(stride, strides)) return nullptr;
  std::optional<int64_t> at;
  if (offset != Py_None) {
    at = PyLong_AsLongLong(offset);
    if (*at == -1 && PyErr_Occurred()) return nullptr;
  }
  try {
    return THPVariable_Wrap(THPVariable_Unpack(base).as_strided(sizes, strides, at));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

PyMethodDef methods[] = {
    {"prepare", prepare, METH_VARARGS, "prepare(kind, rows, names) -> check()"},
    {"prepare_spec", prepare_spec, METH_O, "prepare_spec(spec) -> check(tensor)"},
    {"data_ptrs", data_ptrs, METH_O, "data_ptrs(tensors) -> tuple of addresses"},
    {"as_strided", as_strided, METH_VARARGS, "as_strided(base, size, stride[, offset])"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "kiln_native", nullptr, -1, methods};

}  // namespace

extern PyMethodDef kiln_launch_methods[];  // native_launch.cpp: the generic Triton launch

PyMODINIT_FUNC PyInit_kiln_native(void) {
  dict_name = PyUnicode_InternFromString("__dict__");
  if (dict_name == nullptr) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m != nullptr && PyModule_AddFunctions(m, kiln_launch_methods) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
