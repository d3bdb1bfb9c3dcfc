// DataLoader samplers: the row order of each epoch (sequential, random, weighted, distributed), a pure function
// of the sampler's seed and the epoch.
#include <random>

#include <ATen/CPUGeneratorImpl.h>

#include "loader_internal.hpp"
#include "tensordict/errors.hpp"

namespace tensordict {

namespace loader_internal {

int64_t random_seed() {
  std::random_device rd;
  return static_cast<int64_t>((static_cast<uint64_t>(rd()) << 31) ^ rd()) & INT64_MAX;
}

}  // namespace loader_internal

// ============================================================================ samplers
struct Sampler::Impl {
  enum class Kind { Sequential, Random, Weighted, Distributed } kind = Kind::Sequential;
  int64_t seed = 0;
  at::Tensor weights;  // float64
  int64_t num_samples = 0;
  bool replacement = true;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

namespace {

using loader_internal::random_seed;

at::Generator seeded(int64_t seed) { return at::detail::createCPUGenerator(static_cast<uint64_t>(seed)); }

const Sampler::Impl& impl_of(const std::shared_ptr<const Sampler::Impl>& p) {
  if (!p) throw ValueError("DataLoader: an empty Sampler");
  return *p;
}

}  // namespace

Sampler Sampler::sequential() { return Sampler(std::make_shared<Impl>()); }

Sampler Sampler::random(std::optional<int64_t> seed) {
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Random;
  i->seed = seed ? *seed : random_seed();
  return Sampler(std::move(i));
}

Sampler Sampler::weighted(at::Tensor weights, int64_t num_samples, bool replacement, std::optional<int64_t> seed) {
  if (!weights.defined() || weights.dim() != 1) {
    throw ValueError("Sampler::weighted: weights must be a 1-d tensor (one weight per row), got " +
                     (weights.defined() ? std::to_string(weights.dim()) + " dims" : std::string("an undefined tensor")));
  }
  if (!at::isFloatingType(weights.scalar_type()) && !at::isIntegralType(weights.scalar_type(), true)) {
    throw TypeError("Sampler::weighted: weights must be real numbers, got " + std::string(c10::toString(weights.scalar_type())));
  }
  at::Tensor w = weights.to(at::kDouble).contiguous().clone();
  if (w.numel() == 0) throw ValueError("Sampler::weighted: weights is empty");
  if (!at::isfinite(w).all().item<bool>()) throw ValueError("Sampler::weighted: weights must be finite (found inf or nan)");
  if ((w < 0).any().item<bool>()) {
    throw ValueError("Sampler::weighted: weights must be >= 0, found " +
                     std::to_string(w.min().item<double>()));
  }
  const int64_t nonzero = (w > 0).sum().item<int64_t>();
  if (nonzero == 0) throw ValueError("Sampler::weighted: every weight is 0");
  if (num_samples <= 0) throw ValueError("Sampler::weighted: num_samples must be >= 1, got " + std::to_string(num_samples));
  if (!replacement && num_samples > nonzero) {
    throw ValueError("Sampler::weighted: " + std::to_string(num_samples) + " samples without replacement, but only " +
                     std::to_string(nonzero) + " weights are > 0");
  }
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Weighted;
  i->weights = w;
  i->num_samples = num_samples;
  i->replacement = replacement;
  i->seed = seed ? *seed : random_seed();
  return Sampler(std::move(i));
}

Sampler Sampler::distributed(int64_t rank, int64_t world_size, bool shuffle, std::optional<int64_t> seed,
                             bool drop_last) {
  if (world_size < 1) throw ValueError("Sampler::distributed: world_size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size) {
    throw ValueError("Sampler::distributed: rank must be in [0, world_size) = [0, " + std::to_string(world_size) +
                     "), got " + std::to_string(rank));
  }
  auto i = std::make_shared<Impl>();
  i->kind = Impl::Kind::Distributed;
  i->rank = rank;
  i->world_size = world_size;
  i->shuffle = shuffle;
  i->seed = seed ? *seed : 0;
  i->drop_last = drop_last;
  return Sampler(std::move(i));
}

std::string Sampler::kind() const {
  switch (impl_of(impl_).kind) {
    case Impl::Kind::Sequential: return "sequential";
    case Impl::Kind::Random: return "random";
    case Impl::Kind::Weighted: return "weighted";
    case Impl::Kind::Distributed: return "distributed";
  }
  return "?";
}

int64_t Sampler::length(int64_t n) const {
  const Impl& s = impl_of(impl_);
  if (n < 0) throw ValueError("Sampler: negative dataset length " + std::to_string(n));
  switch (s.kind) {
    case Impl::Kind::Sequential:
    case Impl::Kind::Random: return n;
    case Impl::Kind::Weighted:
      if (s.weights.numel() != n) {
        throw ValueError("Sampler::weighted: " + std::to_string(s.weights.numel()) + " weights for a dataset of " +
                         std::to_string(n) + " rows (one weight per row)");
      }
      return s.num_samples;
    case Impl::Kind::Distributed:
      if (s.drop_last) return n / s.world_size;
      return (n - s.rank + s.world_size - 1) / s.world_size;
  }
  return 0;
}

at::Tensor Sampler::indices(int64_t n, int64_t epoch) const {
  const Impl& s = impl_of(impl_);
  length(n);  // validates
  const auto opts = at::TensorOptions().dtype(at::kLong);
  switch (s.kind) {
    case Impl::Kind::Sequential: return at::arange(n, opts);
    case Impl::Kind::Random: return at::randperm(n, seeded(s.seed + epoch), opts);
    case Impl::Kind::Weighted:
      return at::multinomial(s.weights, s.num_samples, s.replacement, seeded(s.seed + epoch)).to(at::kLong).contiguous();
    case Impl::Kind::Distributed: {
      at::Tensor all = s.shuffle ? at::randperm(n, seeded(s.seed + epoch), opts) : at::arange(n, opts);
      if (s.drop_last) all = all.narrow(0, 0, (n / s.world_size) * s.world_size);
      return all.slice(0, s.rank, all.size(0), s.world_size).contiguous();
    }
  }
  return at::Tensor();
}

}  // namespace tensordict
