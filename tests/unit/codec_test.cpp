// The bf16 wire codec, every build: rounding to nearest even against the definition (the two
// bf16 values around x, chosen by the dropped bits), the special values, exact widening, and
// every length and alignment the vector loops cut into head, body and tail; rounding in place
// beside the wire image as an encode then a decode.
#include "kernels/codec.h"
#include "kernels/cpu/reduce_variants.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace gradsync::kernels {
namespace {

struct Codec {
  const char* name;
  EncodeBf16Fn encode;
  DecodeBf16Fn decode;
  RoundBf16Fn round;
};

std::vector<Codec> builds() {
  std::vector<Codec> all{
      {"generic", &generic::encode_bf16, &generic::decode_bf16, &generic::round_bf16}};
  if (cpu_has_avx2()) {
    all.push_back({"avx2", &avx2::encode_bf16, &avx2::decode_bf16, &avx2::round_bf16});
  }
  return all;
}

// What rounding x to nearest bf16, ties to even, must give (x finite): of the value with the
// low 16 bits dropped (toward zero) and the next one away from zero, the nearer.
uint16_t nearest_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const auto toward_zero = static_cast<uint16_t>(u >> 16);
  const uint32_t dropped = u & 0xffffu;
  if (dropped < 0x8000u) return toward_zero;
  if (dropped > 0x8000u) return static_cast<uint16_t>(toward_zero + 1);
  return (toward_zero & 1u) == 0 ? toward_zero : static_cast<uint16_t>(toward_zero + 1);
}

// Every bf16 value, with low halves around the rounding points and some at random.
std::vector<float> finite_samples() {
  std::vector<float> samples;
  std::mt19937 random(7);
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (const uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                               static_cast<uint32_t>(random() & 0xffffu)}) {
      const float x = std::bit_cast<float>(high << 16 | low);
      if (std::isfinite(x)) samples.push_back(x);
    }
  }
  return samples;
}

TEST(Bf16Codec, EncodeRoundsToNearestEven) {
  const std::vector<float> samples = finite_samples();
  std::vector<uint16_t> encoded(samples.size());
  for (const Codec& codec : builds()) {
    codec.encode(encoded.data(), samples.data(), samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      ASSERT_EQ(encoded[i], nearest_bf16(samples[i]))
          << codec.name << ": " << samples[i] << " (0x" << std::hex
          << std::bit_cast<uint32_t>(samples[i]) << ")";
    }
  }
}

TEST(Bf16Codec, SpecialValuesSurvive) {
  const float inf = std::numeric_limits<float>::infinity();
  // The last NaN has its payload in the dropped bits only: rounding must not make it infinite.
  const std::vector<float> specials{inf,
                                    -inf,
                                    0.0f,
                                    -0.0f,
                                    std::nanf(""),
                                    std::bit_cast<float>(0x7f800001u),
                                    std::bit_cast<float>(0xff800001u)};
  std::vector<uint16_t> encoded(specials.size());
  std::vector<float> decoded(specials.size());
  for (const Codec& codec : builds()) {
    codec.encode(encoded.data(), specials.data(), specials.size());
    codec.decode(decoded.data(), encoded.data(), encoded.size());
    for (size_t i = 0; i < specials.size(); ++i) {
      if (std::isnan(specials[i])) {
        EXPECT_TRUE(std::isnan(decoded[i])) << codec.name << " sample " << i;
      } else {
        EXPECT_EQ(std::bit_cast<uint32_t>(decoded[i]), std::bit_cast<uint32_t>(specials[i]))
            << codec.name << " sample " << i;
      }
    }
  }
}

TEST(Bf16Codec, DecodeWidensEveryValueExactly) {
  std::vector<uint16_t> every(0x10000);
  for (uint32_t i = 0; i < every.size(); ++i) every[i] = static_cast<uint16_t>(i);
  std::vector<float> decoded(every.size());
  for (const Codec& codec : builds()) {
    codec.decode(decoded.data(), every.data(), every.size());
    for (uint32_t i = 0; i < every.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(decoded[i]), i << 16) << codec.name;
    }
  }
}

TEST(Bf16Codec, EveryLengthAndAlignmentTouchesExactlyItsElements) {
  constexpr size_t kMax = 70;
  constexpr uint16_t kFence = 0xabcd;
  std::vector<float> source(kMax + 4);
  for (size_t i = 0; i < source.size(); ++i) source[i] = 1.0f + static_cast<float>(i) / 3.0f;
  for (const Codec& codec : builds()) {
    for (size_t offset = 0; offset < 4; ++offset) {
      for (size_t count = 0; count <= kMax; ++count) {
        std::vector<uint16_t> wire(kMax + 8, kFence);
        codec.encode(wire.data() + offset, source.data() + offset, count);
        std::vector<float> back(kMax + 8, -1.0f);
        codec.decode(back.data() + offset, wire.data() + offset, count);
        for (size_t i = 0; i < wire.size(); ++i) {
          const bool inside = i >= offset && i < offset + count;
          if (!inside) {
            ASSERT_EQ(wire[i], kFence) << codec.name << " count " << count << " at " << i;
            ASSERT_EQ(back[i], -1.0f) << codec.name << " count " << count << " at " << i;
          } else {
            ASSERT_EQ(wire[i], nearest_bf16(source[i])) << codec.name << " count " << count;
            ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), uint32_t{wire[i]} << 16);
          }
        }
      }
    }
  }
}

TEST(Bf16Codec, RoundingInPlaceIsAnEncodeThenADecode) {
  std::vector<float> samples = finite_samples();
  for (const float special : {std::numeric_limits<float>::infinity(), std::nanf(""),
                              std::bit_cast<float>(0x7f800001u), -0.0f}) {
    samples.push_back(special);
  }
  std::vector<uint16_t> expected_wire(samples.size());
  std::vector<float> expected(samples.size());
  for (const Codec& codec : builds()) {
    codec.encode(expected_wire.data(), samples.data(), samples.size());
    codec.decode(expected.data(), expected_wire.data(), expected_wire.size());
    // Offsets and a length the vector loops cut into a head, a body and a tail.
    for (const size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {
      const size_t count = samples.size() - offset - 5;
      std::vector<float> data = samples;
      std::vector<uint16_t> wire(samples.size(), 0xabcd);
      codec.round(wire.data() + offset, data.data() + offset, count);
      for (size_t i = 0; i < samples.size(); ++i) {
        const bool inside = i >= offset && i < offset + count;
        ASSERT_EQ(wire[i], inside ? expected_wire[i] : 0xabcd) << codec.name << " at " << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(data[i]),
                  std::bit_cast<uint32_t>(inside ? expected[i] : samples[i]))
            << codec.name << " at " << i;
      }
    }
  }
}

TEST(Bf16Codec, DispatchedBuildMatchesTheGenericOne) {
  const std::vector<float> samples = finite_samples();
  std::vector<uint16_t> dispatched(samples.size());
  std::vector<uint16_t> generic_result(samples.size());
  encode_bf16(dispatched.data(), samples.data(), samples.size());
  generic::encode_bf16(generic_result.data(), samples.data(), samples.size());
  EXPECT_EQ(dispatched, generic_result);
}

}  // namespace
}  // namespace gradsync::kernels
