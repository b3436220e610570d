/* The record batch v2 header (records.py holds the table; docs/design.md §3), for the C
 * extensions that read or stamp it (_appendpath's appends, _speedups' read walk):
 * big-endian fields at fixed offsets, and the loads and stores of them. */
#ifndef LOGKIT_BATCH_H
#define LOGKIT_BATCH_H

#include <stdint.h>

#define B_BASE_OFFSET 0
#define B_LENGTH 8
#define B_LEADER_EPOCH 12
#define B_MAGIC 16
#define B_CRC 17
#define B_ATTRIBUTES 21           /* the CRC covers from here to the batch's end */
#define B_LAST_OFFSET_DELTA 23
#define B_BASE_TIMESTAMP 27
#define B_MAX_TIMESTAMP 35
#define B_PRODUCER_ID 43
#define B_RECORDS_COUNT 57
#define B_HEADER 61               /* records.RECORDS_OFFSET */
#define LOG_OVERHEAD 12           /* the bytes before batchLength counts */
#define B_MAGIC_V2 2
#define ATTR_CODEC_MASK 0x07
#define ATTR_APPEND_TIME 0x08
#define ATTR_CONTROL 0x20

static inline uint32_t
be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t
be64(const unsigned char *p)
{
    return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static inline void
put_be64(unsigned char *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

#endif
