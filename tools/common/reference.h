// Deterministic test data and the double-precision reference every collective result is checked
// against. Shared by gradsync-bench --check and the tests.
#pragma once

#include <gradsync/gradsync.h>

#include <cstddef>
#include <cstdint>

namespace gradsync::reference {

enum class Kind { kAllreduce, kBroadcast, kAllgather };

// The value rank `rank` contributes at element `i` (small integers: exact in every dtype).
double input_value(int rank, size_t i, gradsync_op op, uint64_t seed = 0);

// What element `i` of every rank's result must be.
double expected_allreduce(int ranks, size_t i, gradsync_dtype dtype, gradsync_op op,
                          uint64_t seed = 0);

void store(void* base, size_t i, gradsync_dtype dtype, double value);
double load(const void* base, size_t i, gradsync_dtype dtype);

// Fills `count` elements with this rank's input.
void fill_input(void* base, size_t count, gradsync_dtype dtype, int rank, gradsync_op op,
                uint64_t seed = 0);

// Fills `count` f32 values of every magnitude from 2^-20 to 2^20, either sign, drawn from
// `seed`: sums of them round differently in different orders (for tests of summation order).
void fill_mixed_magnitudes(float* data, size_t count, uint32_t seed);

// Whether `got` matches `expected` for the dtype (exact for integers; relative for floats).
bool matches(double got, double expected, gradsync_dtype dtype);

// Number of wrong elements in a result of the given collective.
size_t count_wrong(Kind kind, const void* result, size_t count, gradsync_dtype dtype,
                   gradsync_op op, int ranks, int root, uint64_t seed = 0);
// The same for rank `rank`'s result of a reduce-scatter whose inputs were fill_input's over
// `count * ranks` elements: block `rank` of the allreduce of them.
size_t count_wrong_reduce_scatter(const void* result, size_t count, gradsync_dtype dtype,
                                  gradsync_op op, int ranks, int rank, uint64_t seed = 0);
// The same for rank `rank`'s result of an all-to-all whose inputs were fill_input's over
// `count * ranks` elements (with `op`): block r is block `rank` of rank r's input.
size_t count_wrong_alltoall(const void* result, size_t count, gradsync_dtype dtype, gradsync_op op,
                            int ranks, int rank, uint64_t seed = 0);

}  // namespace gradsync::reference
