/* The capture inventory's functions of _graphed_fastcall (gf_inventory_reads.c): note_reads,
 * made_watch, survivors, storage_keys and device_type_code, which graphed._inventory calls per
 * torch call and tensor. */
#ifndef GF_INVENTORY_READS_H
#define GF_INVENTORY_READS_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Adds the functions to `module`; -1 with a Python error set on failure. */
int gf_inventory_reads_init(PyObject *module);

#ifdef __cplusplus
}
#endif

#endif /* GF_INVENTORY_READS_H */
