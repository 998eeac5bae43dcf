/* The hottest calls, made the common way, without Cython's argument parsing.

   Cython's wrapper of a def method with keyword arguments walks the keyword names, takes and drops
   a reference on every argument and fills the defaults: ~80 instructions of `a.allocate(n,
   zero=False)` or `f.allocate(n, zero=False)` and ~50 of the with statement's
   `__exit__(None, None, None)` (callgrind), for calls whose own work is a few hundred.  Here a
   method's PyMethodDef keeps its Cython wrapper for every other call shape (and so every error
   message, help() and inspect.signature()), and its ml_meth becomes an entry that sends the common
   shapes straight to a C-level implementation:

     allocate(size) and allocate(size, zero=z) of an arena (ArenaBase) or a Frame, the keyword
     name the interned "zero" a call site passes: impl(self, size, zero);
     allocate_from(data) and allocate_string(s) of an arena: impl(self, data);
     Frame.__exit__(t, v, tb), positional: impl(self, v);
     Segment.fill(value), positional: impl(self, value).

   CPython reads ml_meth on every call (method descriptors, bound builtin methods and _with.pxi's
   bound methods alike), so the entry serves them all.

   And arenalib.frame(), a def with no parameters, which Cython makes METH_NOARGS: CPython 3.11
   specializes the call of a builtin function only when it is FASTCALL (PRECALL_NO_KW_BUILTIN_FAST),
   and its generic call cost `with arenalib.frame() as f: f.allocate(512, zero=False).fill(3)`
   ~100 ns of ~490 on these machines.  Start-up puts a METH_FASTCALL twin in its place, and one of
   SlicingArena.frame() in its type's dict.

   Included by arenalib/_arena.pyx's parts only (one translation unit). */

#ifndef ARENALIB_ENTRIES_H
#define ARENALIB_ENTRIES_H

#include <Python.h>

typedef PyObject *(*arenalib_size_zero_fn)(PyObject *self, PyObject *size, PyObject *zero);
typedef PyObject *(*arenalib_one_fn)(PyObject *self, PyObject *arg);
typedef PyObject *(*arenalib_self_fn)(PyObject *self);

static PyObject *arenalib_str_zero;  /* interned "zero", as call sites pass it */

/* An entry for method NAME of shape (size[, zero=]): its implementation, and Cython's wrapper for
   every other call shape. */
#define ARENALIB_SIZE_ZERO_ENTRY(NAME)                                                           \
    static arenalib_size_zero_fn NAME##_impl;                                                    \
    static _PyCFunctionFastWithKeywords NAME##_wrapper;                                          \
    static PyObject *NAME##_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs,        \
                                  PyObject *kwnames) {                                           \
        if (nargs == 1) {                                                                        \
            if (kwnames == NULL)                                                                 \
                return NAME##_impl(self, args[0], Py_True);                                      \
            if (PyTuple_GET_SIZE(kwnames) == 1 && PyTuple_GET_ITEM(kwnames, 0) == arenalib_str_zero) \
                return NAME##_impl(self, args[0], args[1]);                                      \
        }                                                                                        \
        return NAME##_wrapper(self, args, nargs, kwnames);                                       \
    }

/* An entry for method NAME whose common shape is one positional argument. */
#define ARENALIB_ONE_ENTRY(NAME)                                                                 \
    static arenalib_one_fn NAME##_impl;                                                          \
    static _PyCFunctionFastWithKeywords NAME##_wrapper;                                          \
    static PyObject *NAME##_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs,        \
                                  PyObject *kwnames) {                                           \
        if (nargs == 1 && kwnames == NULL)                                                       \
            return NAME##_impl(self, args[0]);                                                   \
        return NAME##_wrapper(self, args, nargs, kwnames);                                       \
    }

ARENALIB_SIZE_ZERO_ENTRY(arenalib_arena_allocate)
ARENALIB_ONE_ENTRY(arenalib_arena_allocate_from)
ARENALIB_ONE_ENTRY(arenalib_arena_allocate_string)
ARENALIB_SIZE_ZERO_ENTRY(arenalib_frame_allocate)
ARENALIB_ONE_ENTRY(arenalib_segment_fill)

static arenalib_one_fn arenalib_frame_exit_impl;
static _PyCFunctionFastWithKeywords arenalib_frame_exit_wrapper;

static PyObject *arenalib_frame_exit_entry(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs == 3 && kwnames == NULL)
        return arenalib_frame_exit_impl(self, args[1]);
    return arenalib_frame_exit_wrapper(self, args, nargs, kwnames);
}

/* Make ``entry`` the ml_meth of method ``name`` of ``type`` (a METH_FASTCALL | METH_KEYWORDS
   method descriptor, found before _with.pxi puts its own descriptor in the dict), keeping the old
   one in ``wrapper``. */
static int arenalib_entry_take(PyTypeObject *type, const char *name, void *entry,
                               _PyCFunctionFastWithKeywords *wrapper) {
    PyObject *method = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    PyMethodDef *def = NULL;
    if (method != NULL && Py_TYPE(method) == &PyMethodDescr_Type)
        def = ((PyMethodDescrObject *)method)->d_method;
    if (def == NULL || def->ml_flags != (METH_FASTCALL | METH_KEYWORDS)) {
        PyErr_Format(PyExc_ImportError, "arenalib: %s.%s is not what src/entries.h expects",
                     type->tp_name, name);
        return -1;
    }
    if (arenalib_str_zero == NULL && (arenalib_str_zero = PyUnicode_InternFromString("zero")) == NULL)
        return -1;
    *wrapper = (_PyCFunctionFastWithKeywords)(void (*)(void))def->ml_meth;
    def->ml_meth = (PyCFunction)(void (*)(void))entry;
    return 0;
}

/* Give ArenaBase's allocate, allocate_from and allocate_string their entries (once, at start-up). */
static int arenalib_arena_entries_install(PyTypeObject *arena_type, arenalib_size_zero_fn allocate,
                                          arenalib_one_fn allocate_from, arenalib_one_fn allocate_string) {
    arenalib_arena_allocate_impl = allocate;
    arenalib_arena_allocate_from_impl = allocate_from;
    arenalib_arena_allocate_string_impl = allocate_string;
    if (arenalib_entry_take(arena_type, "allocate", (void *)arenalib_arena_allocate_entry,
                            &arenalib_arena_allocate_wrapper) < 0
            || arenalib_entry_take(arena_type, "allocate_from", (void *)arenalib_arena_allocate_from_entry,
                                   &arenalib_arena_allocate_from_wrapper) < 0
            || arenalib_entry_take(arena_type, "allocate_string", (void *)arenalib_arena_allocate_string_entry,
                                   &arenalib_arena_allocate_string_wrapper) < 0)
        return -1;
    return 0;
}

/* Give Frame's allocate and __exit__ their entries (once, at start-up). */
static int arenalib_frame_entries_install(PyTypeObject *frame_type, arenalib_size_zero_fn allocate,
                                          arenalib_one_fn exit_frame) {
    arenalib_frame_allocate_impl = allocate;
    arenalib_frame_exit_impl = exit_frame;
    if (arenalib_entry_take(frame_type, "allocate", (void *)arenalib_frame_allocate_entry,
                            &arenalib_frame_allocate_wrapper) < 0
            || arenalib_entry_take(frame_type, "__exit__", (void *)arenalib_frame_exit_entry,
                                   &arenalib_frame_exit_wrapper) < 0)
        return -1;
    return 0;
}

/* Give Segment's fill its entry (once, at start-up). */
static int arenalib_segment_entries_install(PyTypeObject *segment_type, arenalib_one_fn fill) {
    arenalib_segment_fill_impl = fill;
    return arenalib_entry_take(segment_type, "fill", (void *)arenalib_segment_fill_entry,
                               &arenalib_segment_fill_wrapper);
}

/* A callable of no arguments made METH_FASTCALL, its PyMethodDef a twin of Cython's (name and
   docstring: inspect.signature() stays), with the errors of a call of no arguments. */
#define ARENALIB_NOARGS_ENTRY(NAME)                                                              \
    static arenalib_self_fn NAME##_impl;                                                         \
    static PyMethodDef NAME##_def;                                                               \
    static PyObject *NAME##_entry(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {      \
        (void)args;                                                                              \
        if (nargs != 0) {                                                                        \
            PyErr_Format(PyExc_TypeError, "%s() takes no arguments (%zd given)",                  \
                         NAME##_def.ml_name, nargs);                                             \
            return NULL;                                                                         \
        }                                                                                        \
        return NAME##_impl(self);                                                                \
    }

ARENALIB_NOARGS_ENTRY(arenalib_frame_function)  /* arenalib.frame(), called with the module's self (NULL) */
ARENALIB_NOARGS_ENTRY(arenalib_arena_frame)     /* SlicingArena.frame() */

static void arenalib_noargs_twin(PyMethodDef *twin, const PyMethodDef *def, void *entry) {
    twin->ml_name = def->ml_name;
    twin->ml_meth = (PyCFunction)(void (*)(void))entry;
    twin->ml_flags = METH_FASTCALL;
    twin->ml_doc = def->ml_doc;
}

/* Replace the module function ``frame`` in ``globals`` by its twin (once, at start-up). */
static int arenalib_frame_function_install(PyObject *globals, arenalib_self_fn impl) {
    PyObject *function = PyDict_GetItemString(globals, "frame");  /* borrowed */
    if (function == NULL || !PyCFunction_CheckExact(function)
            || PyCFunction_GET_FLAGS(function) != METH_NOARGS) {
        PyErr_SetString(PyExc_ImportError, "arenalib: frame() is not what src/entries.h expects");
        return -1;
    }
    arenalib_noargs_twin(&arenalib_frame_function_def, ((PyCFunctionObject *)function)->m_ml,
                         (void *)arenalib_frame_function_entry);
    arenalib_frame_function_impl = impl;
    PyObject *twin = PyCFunction_NewEx(&arenalib_frame_function_def, PyCFunction_GET_SELF(function),
                                       ((PyCFunctionObject *)function)->m_module);
    if (twin == NULL)
        return -1;
    int failed = PyDict_SetItemString(globals, "frame", twin);
    Py_DECREF(twin);
    return failed;
}

/* Replace the method ``frame`` of ``arena_type`` (SlicingArena) by a method descriptor of its twin
   (once, at start-up): Cython's wrapper of a method of no arguments is FASTCALL with keywords, and
   parses both on every call. */
static int arenalib_arena_frame_install(PyTypeObject *arena_type, arenalib_self_fn impl) {
    PyObject *method = PyDict_GetItemString(arena_type->tp_dict, "frame");  /* borrowed */
    if (method == NULL || Py_TYPE(method) != &PyMethodDescr_Type
            || ((PyMethodDescrObject *)method)->d_method->ml_flags != (METH_FASTCALL | METH_KEYWORDS)) {
        PyErr_SetString(PyExc_ImportError,
                        "arenalib: SlicingArena.frame is not what src/entries.h expects");
        return -1;
    }
    arenalib_noargs_twin(&arenalib_arena_frame_def, ((PyMethodDescrObject *)method)->d_method,
                         (void *)arenalib_arena_frame_entry);
    arenalib_arena_frame_impl = impl;
    PyObject *twin = PyDescr_NewMethod(arena_type, &arenalib_arena_frame_def);
    if (twin == NULL)
        return -1;
    int failed = PyDict_SetItemString(arena_type->tp_dict, "frame", twin);
    Py_DECREF(twin);
    PyType_Modified(arena_type);
    return failed;
}

#endif  /* ARENALIB_ENTRIES_H */
