/* Frame.allocate() and Frame.__exit__() called the common way, without Cython's argument parsing
   (arenalib/_frames.pxi says why).

   Cython's wrapper of a def method with keyword arguments walks the keyword names, takes and drops
   a reference on every argument and fills the defaults: ~80 instructions of `f.allocate(n,
   zero=False)` and ~50 of the with statement's `__exit__(None, None, None)` (callgrind), for a
   frame whose own work is a few dozen.  Here the method's PyMethodDef keeps its Cython wrapper for every other
   call shape (and so every error message, help() and inspect.signature()), and its ml_meth becomes
   an entry that sends the common shapes straight to a C-level implementation:

     allocate(size) and allocate(size, zero=z), the keyword name the interned "zero" a call site
     passes: impl(self, size, zero);
     __exit__(t, v, tb), positional: impl(self).

   CPython reads ml_meth on every call (method descriptors, bound builtin methods and _with.pxi's
   bound methods alike), so the entry serves them all.  Included by arenalib/_frames.pxi only. */

#ifndef ARENALIB_FRAMES_H
#define ARENALIB_FRAMES_H

#include <Python.h>

typedef PyObject *(*arenalib_frame_allocate_fn)(PyObject *self, PyObject *size, PyObject *zero);
typedef PyObject *(*arenalib_frame_exit_fn)(PyObject *self);

static _PyCFunctionFastWithKeywords arenalib_frame_allocate_wrapper;  /* Cython's */
static arenalib_frame_allocate_fn arenalib_frame_allocate_impl;
static _PyCFunctionFastWithKeywords arenalib_frame_exit_wrapper;
static arenalib_frame_exit_fn arenalib_frame_exit_impl;
static PyObject *arenalib_str_zero;

static PyObject *arenalib_frame_allocate_entry(PyObject *self, PyObject *const *args,
                                               Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs == 1) {
        if (kwnames == NULL)
            return arenalib_frame_allocate_impl(self, args[0], Py_True);
        if (PyTuple_GET_SIZE(kwnames) == 1 && PyTuple_GET_ITEM(kwnames, 0) == arenalib_str_zero)
            return arenalib_frame_allocate_impl(self, args[0], args[1]);
    }
    return arenalib_frame_allocate_wrapper(self, args, nargs, kwnames);
}

static PyObject *arenalib_frame_exit_entry(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs == 3 && kwnames == NULL)
        return arenalib_frame_exit_impl(self);
    return arenalib_frame_exit_wrapper(self, args, nargs, kwnames);
}

/* The PyMethodDef of method ``name`` of ``type``, found through its method descriptor (before
   _with.pxi puts its own descriptor in the dict); NULL if it is not a METH_FASTCALL |
   METH_KEYWORDS method. */
static PyMethodDef *arenalib_method_def(PyTypeObject *type, const char *name) {
    PyObject *method = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (method == NULL || Py_TYPE(method) != &PyMethodDescr_Type)
        return NULL;
    PyMethodDef *def = ((PyMethodDescrObject *)method)->d_method;
    return def->ml_flags == (METH_FASTCALL | METH_KEYWORDS) ? def : NULL;
}

/* Give Frame's allocate and __exit__ their entries (once, at module start-up). */
static int arenalib_frame_entries_install(PyTypeObject *frame_type, arenalib_frame_allocate_fn allocate,
                                          arenalib_frame_exit_fn exit_frame) {
    PyMethodDef *allocate_def = arenalib_method_def(frame_type, "allocate");
    PyMethodDef *exit_def = arenalib_method_def(frame_type, "__exit__");
    if (allocate_def == NULL || exit_def == NULL) {
        PyErr_SetString(PyExc_ImportError, "arenalib: Frame's methods are not what src/frames.h expects");
        return -1;
    }
    arenalib_str_zero = PyUnicode_InternFromString("zero");
    if (arenalib_str_zero == NULL)
        return -1;
    arenalib_frame_allocate_impl = allocate;
    arenalib_frame_allocate_wrapper = (_PyCFunctionFastWithKeywords)(void (*)(void))allocate_def->ml_meth;
    allocate_def->ml_meth = (PyCFunction)(void (*)(void))arenalib_frame_allocate_entry;
    arenalib_frame_exit_impl = exit_frame;
    arenalib_frame_exit_wrapper = (_PyCFunctionFastWithKeywords)(void (*)(void))exit_def->ml_meth;
    exit_def->ml_meth = (PyCFunction)(void (*)(void))arenalib_frame_exit_entry;
    return 0;
}

/* arenalib.frame() as a METH_FASTCALL builtin.  Cython makes a def with no parameters METH_NOARGS,
   and CPython 3.11 specializes the call of a FASTCALL builtin only (PRECALL_NO_KW_BUILTIN_FAST): its
   generic call cost `with arenalib.frame()` ~60 instructions (callgrind).  The twin keeps the
   function's name, module and docstring (its text signature: inspect.signature()), and refuses
   arguments with the messages a METH_NOARGS builtin gives. */
typedef PyObject *(*arenalib_frame_new_fn)(void);
static arenalib_frame_new_fn arenalib_frame_new_impl;
static PyMethodDef arenalib_frame_function_def;

static PyObject *arenalib_frame_function_entry(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    (void)args;
    if (nargs != 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes no arguments (%zd given)",
                     arenalib_frame_function_def.ml_name, nargs);
        return NULL;
    }
    return arenalib_frame_new_impl();
}

/* Replace the module function ``frame`` in ``globals`` by its FASTCALL twin (once, at start-up). */
static int arenalib_frame_function_install(PyObject *globals, arenalib_frame_new_fn impl) {
    PyObject *function = PyDict_GetItemString(globals, "frame");  /* borrowed */
    if (function == NULL || !PyCFunction_CheckExact(function)
            || PyCFunction_GET_FLAGS(function) != METH_NOARGS) {
        PyErr_SetString(PyExc_ImportError, "arenalib: frame() is not what src/frames.h expects");
        return -1;
    }
    PyMethodDef *def = ((PyCFunctionObject *)function)->m_ml;
    arenalib_frame_function_def.ml_name = def->ml_name;
    arenalib_frame_function_def.ml_meth = (PyCFunction)(void (*)(void))arenalib_frame_function_entry;
    arenalib_frame_function_def.ml_flags = METH_FASTCALL;
    arenalib_frame_function_def.ml_doc = def->ml_doc;
    arenalib_frame_new_impl = impl;
    PyObject *twin = PyCFunction_NewEx(&arenalib_frame_function_def, PyCFunction_GET_SELF(function),
                                       ((PyCFunctionObject *)function)->m_module);
    if (twin == NULL)
        return -1;
    int failed = PyDict_SetItemString(globals, "frame", twin);
    Py_DECREF(twin);
    return failed;
}

#endif  /* ARENALIB_FRAMES_H */
