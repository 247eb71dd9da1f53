// Top-k chunk sparsification (GradientFlow's coarse-grained sparse communication): a tensor is
// cut into chunks of a fixed number of elements, each chunk's energy (the sum of its squares)
// says how much it would move the model, and only the chunks with the most energy travel. What
// stays behind is kept and added to the tensor's next allreduce (error feedback), so nothing
// of a gradient is lost, only delayed. Pure functions over pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace gradsync::kernels {

// carried[i] += the sum of gradients[g][i] (at least one): the new gradient joins what was held
// back, in the one buffer that keeps whatever is not sent (so keeping it costs no copy). Then
// energy[c] = the sum of carried[i]^2 over chunk c, [c * chunk_elements, (c + 1) *
// chunk_elements) cut at `count`: ceil(count / chunk_elements) chunks. One pass over memory.
void carry_and_measure(float* carried, std::span<const float* const> gradients, size_t count,
                       size_t chunk_elements, float* energy);

// The `chosen.size()` chunks with the most energy, their indices in ascending order. A NaN
// energy counts as the most (a NaN in a gradient travels, as it would without the codec);
// equal energies go to the lower index, so that every node that holds the same energies
// chooses the same chunks. `order` is scratch of energy.size() entries.
void choose_chunks(std::span<const float> energy, std::span<uint32_t> chosen,
                   std::span<uint32_t> order);

}  // namespace gradsync::kernels
