/* The XPU backend's one device kernel, built to SPIR-V by the build and embedded in the library:
 * a gather copy that reads its (src, dst, bytes) entries from a table in device memory. Because
 * the kernel's arguments (the table's address and the entry count) never change, a launch of it
 * recorded into a graph stays valid while the table's contents are rewritten before each replay:
 * neither torch's XPU graph nor Level Zero can edit a finished graph's kernel arguments.
 *
 * Launch shape: group size (GF_XPU_GATHER_GROUP_SIZE, 1, 1), group count (groups_per_copy, count,
 * 1). Dimension 1 picks the entry; the groups of dimension 0 and their work-items stride over its
 * bytes, 16 at a time when source, destination and length are all 16-byte aligned, else one. */

typedef struct gf_xpu_gather_entry {
  ulong src;
  ulong dst;
  ulong bytes;
} gf_xpu_gather_entry;

__kernel void gf_xpu_gather(__global const gf_xpu_gather_entry *table, uint count) {
  size_t entry = get_group_id(1);
  if (entry >= count) {
    return;
  }
  ulong src = table[entry].src;
  ulong dst = table[entry].dst;
  ulong bytes = table[entry].bytes;
  size_t first = get_group_id(0) * get_local_size(0) + get_local_id(0);
  size_t stride = get_num_groups(0) * get_local_size(0);
  if (((src | dst | bytes) & 15) == 0) {
    __global const uint4 *from = (__global const uint4 *)src;
    __global uint4 *to = (__global uint4 *)dst;
    for (size_t i = first; i < bytes / 16; i += stride) {
      to[i] = from[i];
    }
  } else {
    __global const uchar *from = (__global const uchar *)src;
    __global uchar *to = (__global uchar *)dst;
    for (size_t i = first; i < bytes; i += stride) {
      to[i] = from[i];
    }
  }
}
