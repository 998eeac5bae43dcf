/* The with-descriptor: a descriptor for ArenaBase.__enter__ and __exit__ that binds each to a
   small untracked object instead of a GC-tracked builtin method (arenalib/_with.pxi says why).

   C, not Cython: these are two static PyTypeObjects with their own slots (tp_descr_get,
   vectorcall, tp_getattro) and a free list of bare PyObjects, none of which a cdef class can be.
   Included by arenalib/_with.pxi only, into the one translation unit of arenalib._arena. */

#ifndef ARENALIB_WITH_H
#define ARENALIB_WITH_H

#include <Python.h>
#include <stddef.h>
#include <string.h>

#include "arenalib/platform.h"  /* ARENALIB_FREE_THREADED */

typedef struct {
    PyObject_HEAD
    PyObject *method;           /* the original method descriptor (PyMethodDescr_Type) */
} arenalib_fast_method;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *method;
    PyObject *self;
} arenalib_bound_method;

static PyTypeObject arenalib_fast_method_type;
static PyTypeObject arenalib_bound_method_type;

#if !ARENALIB_FREE_THREADED
#define ARENALIB_BOUND_FREELIST 8
static PyObject *arenalib_bound_freelist[ARENALIB_BOUND_FREELIST];
static int arenalib_bound_free_count;
#endif

static PyObject *arenalib_bound_call(PyObject *callable, PyObject *const *args, size_t nargsf,
                                     PyObject *kwnames) {
    arenalib_bound_method *b = (arenalib_bound_method *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyMethodDef *def = ((PyMethodDescrObject *)b->method)->d_method;
    int flags = def->ml_flags & ~(METH_CLASS | METH_STATIC | METH_COEXIST);
    if (flags == METH_NOARGS && nargs == 0 && kwnames == NULL)
        return def->ml_meth(b->self, NULL);
    if (flags == (METH_FASTCALL | METH_KEYWORDS))
        return ((_PyCFunctionFastWithKeywords)(void (*)(void))def->ml_meth)(
            b->self, args, nargs, kwnames);
    /* Any other convention (and every error message): the method descriptor's own call. */
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **stack = total < 8 ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[0] = b->self;
    if (total)
        memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    PyObject *result = PyObject_Vectorcall(b->method, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return result;
}

/* PyObject_TypeCheck(obj, type), its common answer without a call: a static type's chain of
   primary bases is in its MRO, so arenalib's own classes are answered by that walk (the full MRO:
   PyType_IsSubtype, ~17 instructions a bind, two binds a with statement).  A heap type's MRO is
   whatever its metaclass's mro() made it, which may leave a base out: the full test. */
static int arenalib_instance_of(PyObject *obj, PyTypeObject *type) {
    PyTypeObject *t = Py_TYPE(obj);
    if (!(t->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        for (; t != NULL; t = t->tp_base)
            if (t == type)
                return 1;
    }
    return PyType_IsSubtype(Py_TYPE(obj), type);
}

static PyObject *arenalib_fast_method_get(PyObject *descr, PyObject *obj, PyObject *type) {
    arenalib_fast_method *d = (arenalib_fast_method *)descr;
    /* Through the class, or bound to what is not an instance of the method's class (the
       descriptor copied into another class, or type(d).__get__(d, x)): the method descriptor's
       own binding, which returns itself or raises TypeError as CPython's descr_check does. */
    if (obj == NULL || !arenalib_instance_of(obj, PyDescr_TYPE(d->method)))
        return Py_TYPE(d->method)->tp_descr_get(d->method, obj, type);
    arenalib_bound_method *b;
#if !ARENALIB_FREE_THREADED
    if (arenalib_bound_free_count) {
        b = (arenalib_bound_method *)arenalib_bound_freelist[--arenalib_bound_free_count];
        (void)PyObject_Init((PyObject *)b, &arenalib_bound_method_type);
    } else
#endif
    {
        b = PyObject_New(arenalib_bound_method, &arenalib_bound_method_type);
        if (b == NULL)
            return NULL;
    }
    b->vectorcall = arenalib_bound_call;
    Py_INCREF(d->method);
    b->method = d->method;
    Py_INCREF(obj);
    b->self = obj;
    return (PyObject *)b;
}

/* The builtin method the with statement would have made: what a bound one shows of itself. */
static PyObject *arenalib_bound_real(arenalib_bound_method *b) {
    return Py_TYPE(b->method)->tp_descr_get(b->method, b->self, (PyObject *)Py_TYPE(b->self));
}

static PyObject *arenalib_bound_getattro(PyObject *self, PyObject *name) {
    PyObject *real = arenalib_bound_real((arenalib_bound_method *)self);
    if (real == NULL)
        return NULL;
    PyObject *result = PyObject_GetAttr(real, name);
    Py_DECREF(real);
    return result;
}

static PyObject *arenalib_bound_repr(PyObject *self) {
    PyObject *real = arenalib_bound_real((arenalib_bound_method *)self);
    if (real == NULL)
        return NULL;
    PyObject *result = PyObject_Repr(real);
    Py_DECREF(real);
    return result;
}

static void arenalib_bound_dealloc(PyObject *self) {
    arenalib_bound_method *b = (arenalib_bound_method *)self;
    Py_DECREF(b->self);
    Py_DECREF(b->method);
#if !ARENALIB_FREE_THREADED
    if (arenalib_bound_free_count < ARENALIB_BOUND_FREELIST) {
        arenalib_bound_freelist[arenalib_bound_free_count++] = self;
        return;
    }
#endif
    PyObject_Free(self);
}

static PyObject *arenalib_fast_method_getattro(PyObject *self, PyObject *name) {
    return PyObject_GetAttr(((arenalib_fast_method *)self)->method, name);
}

static PyObject *arenalib_fast_method_repr(PyObject *self) {
    return PyObject_Repr(((arenalib_fast_method *)self)->method);
}

static void arenalib_fast_method_dealloc(PyObject *self) {
    Py_DECREF(((arenalib_fast_method *)self)->method);
    PyObject_Free(self);
}

static PyTypeObject arenalib_bound_method_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib._arena.bound_method",
    .tp_basicsize = sizeof(arenalib_bound_method),
    .tp_dealloc = arenalib_bound_dealloc,
    .tp_vectorcall_offset = offsetof(arenalib_bound_method, vectorcall),
    .tp_repr = arenalib_bound_repr,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = arenalib_bound_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A context-manager method of an arena, bound (see arenalib/_with.pxi).",
};

static PyTypeObject arenalib_fast_method_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib._arena.fast_method",
    .tp_basicsize = sizeof(arenalib_fast_method),
    .tp_dealloc = arenalib_fast_method_dealloc,
    .tp_repr = arenalib_fast_method_repr,
    .tp_getattro = arenalib_fast_method_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A context-manager method of the arenas (see arenalib/_with.pxi).",
    .tp_descr_get = arenalib_fast_method_get,
};

/* Put the descriptor in place of ``name`` in ``type``'s dict, if it is a method descriptor
   of a calling convention arenalib_bound_call serves; 0 on success or when left alone. */
static int arenalib_fast_method_install(PyTypeObject *type, const char *name) {
    if (PyType_Ready(&arenalib_bound_method_type) < 0
            || PyType_Ready(&arenalib_fast_method_type) < 0)
        return -1;
    PyObject *method = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (method == NULL || Py_TYPE(method) != &PyMethodDescr_Type)
        return 0;
    arenalib_fast_method *d = PyObject_New(arenalib_fast_method, &arenalib_fast_method_type);
    if (d == NULL)
        return -1;
    Py_INCREF(method);
    d->method = method;
    int err = PyDict_SetItemString(type->tp_dict, name, (PyObject *)d);
    Py_DECREF(d);
    PyType_Modified(type);
    return err;
}

#endif  /* ARENALIB_WITH_H */
