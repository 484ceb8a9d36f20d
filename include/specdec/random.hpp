// specdec/random.hpp — counter-based randomness: every random number is a pure function of
// (seed, position, stream, index), so no hidden generator state leaks between calls or policies.
// Entry point: specdec::CounterRng. Read next: sampling.hpp.
#pragma once

#include <array>
#include <cstdint>

namespace specdec {

/// What a random number is used for. Different purposes at the same position draw independent numbers.
enum class RandomStream : std::uint32_t {
  draft = 1,   // the draft's sample at a position
  accept = 2,  // the acceptance test of a drafted token
  target = 3,  // the target's own sample (plain decoding, residual, bonus token)
  gumbel = 4,  // per-token Gumbel noise of CoupledSampling
};

/// Philox4x32-10 (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): a keyed
/// bijection of a 128-bit counter. The key is the seed; the counter is (position, stream, index).
class CounterRng {
 public:
  explicit CounterRng(std::uint64_t seed) : key_{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)} {}

  /// Four independent 32-bit words for one counter value.
  std::array<std::uint32_t, 4> block(std::uint64_t position, RandomStream stream, std::uint32_t index) const {
    std::array<std::uint32_t, 4> ctr{static_cast<std::uint32_t>(position), static_cast<std::uint32_t>(position >> 32),
                                     static_cast<std::uint32_t>(stream), index};
    std::array<std::uint32_t, 2> key = key_;
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * ctr[0];
      const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * ctr[2];
      ctr = {static_cast<std::uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<std::uint32_t>(p1),
             static_cast<std::uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<std::uint32_t>(p0)};
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    return ctr;
  }

  /// A uniform double in the open interval (0, 1), from 52 random bits (unit_from_bits).
  double uniform(std::uint64_t position, RandomStream stream, std::uint32_t index = 0) const {
    const auto b = block(position, stream, index);
    return to_unit(b[0], b[1]);
  }

  /// Maps two 32-bit words to a double in (0, 1): never 0, never 1, so log() of it is always finite.
  static double to_unit(std::uint32_t hi, std::uint32_t lo) {
    const std::uint64_t bits = (std::uint64_t{hi} << 21) ^ (std::uint64_t{lo} >> 11);  // 53 bits, the top 52 used
    return unit_from_bits(bits << 11);
  }
  /// The top 52 bits of `bits` as (m + 0.5)·2^-52, strictly inside (0, 1). 52, not 53: m + 0.5 is exact in a
  /// double only below 2^52 (from 2^52 on the spacing is 1, and 2^53 − 0.5 would round up to u = 1).
  static double unit_from_bits(std::uint64_t bits) {
    return (static_cast<double>(bits >> 12) + 0.5) * 0x1.0p-52;
  }

 private:
  std::array<std::uint32_t, 2> key_;
};

}  // namespace specdec
