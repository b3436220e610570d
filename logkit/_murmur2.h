/* Kafka's murmur2 (seed 0x9747b28c), the hash of its default keyed partitioner, for the
 * C extensions that need it (_speedups.murmur2, _sendpath's keyed send). Mirrors
 * logkit/murmur2.py exactly; Kafka's published vectors are checked in the tests. */
#ifndef LOGKIT_MURMUR2_H
#define LOGKIT_MURMUR2_H

#include <stdint.h>

static inline uint32_t
logkit_murmur2(const unsigned char *data, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    const int r = 24;
    uint32_t h = 0x9747b28cU ^ (uint32_t)length, k;
    Py_ssize_t i, end4 = length & ~(Py_ssize_t)3;
    for (i = 0; i < end4; i += 4) {
        k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) |
            ((uint32_t)data[i + 2] << 16) | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> r;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)data[end4 + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)data[end4 + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)data[end4];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

#endif
