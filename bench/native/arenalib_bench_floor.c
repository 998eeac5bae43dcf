/* The floor under experiment 8's frame statement (bench/frames.py): the cheapest C-level objects
   that the statement `with fa() as f: f.allocate(n, zero=False).fill(3)` can run over.

   A NullArena's frame() makes a NullFrame (from a free list); its __enter__ returns it, its
   __exit__ returns False; its allocate(size, *, zero=True, align=None) makes a NullSegment (from a
   free list) of `size` bytes of one static buffer, whose fill(value) is one memset.  No checks,
   no bookkeeping, plain C with CPython's fastest calling conventions and argument handling by
   hand: what CPython itself charges for the statement (the bytecode, the with protocol's look-ups
   and bound methods, five calls, two objects made and dropped) plus the memset.  Measured in the
   same rounds as arenalib's frames, the difference is arenalib's own cost. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define FLOOR_BUFFER (1 << 20)
#define FLOOR_FREELIST 16

static unsigned char floor_buffer[FLOOR_BUFFER];

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;
} NullSegment;

typedef struct {
    PyObject_HEAD
    PyObject *arena;
} NullFrame;

static PyTypeObject NullSegment_Type, NullFrame_Type, NullArena_Type;
static PyObject *segment_free[FLOOR_FREELIST], *frame_free[FLOOR_FREELIST];
static int segment_free_count, frame_free_count;
static PyObject *str_zero;

/* Objects from a free list (as CPython's own float and tuple free lists; with the GIL only), else
   from the heap. */
#ifdef Py_GIL_DISABLED
#define FLOOR_FREE_LISTS 0
#else
#define FLOOR_FREE_LISTS 1
#endif

static PyObject *floor_new(PyTypeObject *type, PyObject **freelist, int *count) {
    PyObject *op;
    if (FLOOR_FREE_LISTS && *count) {
        op = freelist[--*count];
        (void)PyObject_Init(op, type);
        return op;
    }
    return PyObject_New(PyObject, type);
}

static void floor_release(PyObject *op, PyObject **freelist, int *count) {
    if (FLOOR_FREE_LISTS && *count < FLOOR_FREELIST)
        freelist[(*count)++] = op;
    else
        PyObject_Free(op);
}

static PyObject *segment_fill(PyObject *self, PyObject *value) {
    long byte = PyLong_AsLong(value);
    if (byte == -1 && PyErr_Occurred())
        return NULL;
    memset(floor_buffer, (int)byte, (size_t)((NullSegment *)self)->size);
    return Py_NewRef(self);
}

static void segment_dealloc(PyObject *self) {
    floor_release(self, segment_free, &segment_free_count);
}

static PyObject *frame_enter(PyObject *self, PyObject *unused) {
    return Py_NewRef(self);
}

static PyObject *frame_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return Py_NewRef(Py_False);
}

static PyObject *frame_allocate(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs != 1 || nkw > 1 || (nkw && PyTuple_GET_ITEM(kwnames, 0) != str_zero)) {
        PyErr_SetString(PyExc_TypeError, "allocate(size, *, zero=True): the floor takes these only");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[0]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0 || size > FLOOR_BUFFER) {
        PyErr_SetString(PyExc_ValueError, "size out of the floor's buffer");
        return NULL;
    }
    NullSegment *seg = (NullSegment *)floor_new(&NullSegment_Type, segment_free, &segment_free_count);
    if (seg == NULL)
        return NULL;
    seg->size = size;
    return (PyObject *)seg;
}

static void frame_dealloc(PyObject *self) {
    Py_CLEAR(((NullFrame *)self)->arena);
    floor_release(self, frame_free, &frame_free_count);
}

static PyObject *arena_frame(PyObject *self, PyObject *unused) {
    NullFrame *frame = (NullFrame *)floor_new(&NullFrame_Type, frame_free, &frame_free_count);
    if (frame == NULL)
        return NULL;
    frame->arena = Py_NewRef(self);
    return (PyObject *)frame;
}

static PyMethodDef segment_methods[] = {
    {"fill", segment_fill, METH_O, "memset of the segment's size into one buffer; returns it"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef frame_methods[] = {
    {"__enter__", frame_enter, METH_NOARGS, "returns the frame"},
    {"__exit__", (PyCFunction)(void (*)(void))frame_exit, METH_FASTCALL, "returns False"},
    {"allocate", (PyCFunction)(void (*)(void))frame_allocate, METH_FASTCALL | METH_KEYWORDS,
     "a NullSegment of size bytes"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef arena_methods[] = {
    {"frame", arena_frame, METH_NOARGS, "a NullFrame"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject NullSegment_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullSegment",
    .tp_basicsize = sizeof(NullSegment),
    .tp_dealloc = segment_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = segment_methods,
};

static PyTypeObject NullFrame_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullFrame",
    .tp_basicsize = sizeof(NullFrame),
    .tp_dealloc = frame_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = frame_methods,
};

static PyTypeObject NullArena_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arenalib_bench_floor.NullArena",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = arena_methods,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT, "arenalib_bench_floor",
    "The cheapest C-level frame statement: experiment 8's floor (see the file's comment).", -1, NULL,
};

PyMODINIT_FUNC PyInit_arenalib_bench_floor(void) {
    if (PyType_Ready(&NullSegment_Type) < 0 || PyType_Ready(&NullFrame_Type) < 0
            || PyType_Ready(&NullArena_Type) < 0)
        return NULL;
    str_zero = PyUnicode_InternFromString("zero");
    if (str_zero == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&floor_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "NullArena", (PyObject *)&NullArena_Type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED);  /* (no free lists there) */
#endif
    return module;
}
