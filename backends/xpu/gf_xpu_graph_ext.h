/* Our own declarations of Level Zero's record-and-replay graph extension, because the headers a
 * build finds (Debian's are spec 1.4) predate it and the driver no longer exports its symbols:
 * it is reached only by name, through zeDriverGetExtensionFunctionAddress. Two forms exist: the
 * experimental one of compute-runtime 25.31 and later (`…Exp`, extension
 * ZE_experimental_record_replay_graph) and the standard one of spec 1.17 (`…Ext`, extension
 * ZE_extension_record_replay_graph), whose arguments are in another order (for example
 * EndGraphCapture(list, &graph, pNext) became (list, pNext, &graph)). Only the calls this backend
 * makes have typedefs; the rest are looked up by name to prove the extension is whole. */
#ifndef GF_XPU_GRAPH_EXT_H
#define GF_XPU_GRAPH_EXT_H

#include <level_zero/ze_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GF_ZE_GRAPH_EXTENSION_EXP "ZE_experimental_record_replay_graph"
#define GF_ZE_GRAPH_EXTENSION_EXT "ZE_extension_record_replay_graph"

/* zeDeviceGetProperties pNext: the device's graph capabilities (stype 0x00030029). */
#define GF_ZE_STRUCTURE_TYPE_RECORD_REPLAY_GRAPH_PROPERTIES ((ze_structure_type_t)0x00030029)
enum { GF_ZE_GRAPH_FLAG_IMMUTABLE = 1u << 0, GF_ZE_GRAPH_FLAG_MUTABLE = 1u << 1 };

typedef struct gf_ze_record_replay_graph_properties {
  ze_structure_type_t stype;
  void *pNext;
  uint32_t graphFlags;
} gf_ze_record_replay_graph_properties;

/* The answers of IsGraphCaptureEnabled, which are not errors. */
#define GF_ZE_RESULT_QUERY_TRUE ((ze_result_t)0x7fff0000)
#define GF_ZE_RESULT_QUERY_FALSE ((ze_result_t)0x7fff0001)

/* Same signature in both forms. */
typedef ze_result_t (*gf_ze_list_is_graph_capture_enabled_fn)(ze_command_list_handle_t list);

enum { GF_ZE_GRAPH_FUNCTION_COUNT = 7 };

#ifdef __cplusplus
}
#endif

#endif /* GF_XPU_GRAPH_EXT_H */
