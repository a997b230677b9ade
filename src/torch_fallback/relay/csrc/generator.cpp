// relay random numbers. Random ops run on the fallback target, so a relay
// generator is a pair of target generators: a CPU one, and the CUDA one of its
// GPU (made on first use). relay's default generators pair the targets' own
// default generators, so that a seeded relay draw equals the seeded eager draw
// on the target; torch.Generator(device="relay") pairs new ones.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <torch_fallback/cuda.h>

#include <deque>
#include <mutex>
#include <optional>

#include "relay.h"

namespace torch_fallback::relay {
namespace {

c10::Device relay_device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

int64_t cpu_state_bytes() {
  static const int64_t bytes = at::detail::getDefaultCPUGenerator().get_state().numel();
  return bytes;
}

// Runs f on a generator under its lock, as every user of a generator must.
template <typename F>
auto locked(const at::Generator& gen, F&& f) {
  at::Generator handle = gen;
  std::lock_guard<std::mutex> lock(handle.mutex());
  return f(handle);
}

class RelayGeneratorImpl final : public c10::GeneratorImpl {
 public:
  RelayGeneratorImpl(c10::DeviceIndex index, bool is_default)
      : c10::GeneratorImpl(relay_device(index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        index_(index),
        is_default_(is_default),
        cpu_(is_default ? at::detail::getDefaultCPUGenerator() : at::detail::createCPUGenerator()) {}

  // The generator of the target that a random op runs on.
  at::Generator for_target(c10::Device target) const {
    return target.is_cuda() ? cuda() : cpu_;
  }

  void set_current_seed(uint64_t seed) override {
    for_each([seed](at::Generator& gen) { gen.set_current_seed(seed); });
  }

  void set_offset(uint64_t offset) override {
    if (has_gpu()) locked(cuda(), [offset](at::Generator& gen) { gen.set_offset(offset); });
  }

  uint64_t get_offset() const override {
    return has_gpu() ? locked(cuda(), [](at::Generator& gen) { return gen.get_offset(); }) : 0;
  }

  uint64_t current_seed() const override {
    return locked(cpu_, [](at::Generator& gen) { return gen.current_seed(); });
  }

  uint64_t seed() override {
    const uint64_t seed = c10::detail::getNonDeterministicRandom();
    set_current_seed(seed);
    return seed;
  }

  // The CPU state, then the CUDA state where a GPU is visible.
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor state = locked(cpu_, [](at::Generator& gen) { return gen.get_state(); });
    if (has_gpu()) {
      const at::Tensor cuda_state =
          locked(cuda(), [](at::Generator& gen) { return gen.get_state(); });
      state = at::cat(std::vector<at::Tensor>{state, cuda_state});
    }
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    const at::Tensor state = at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
        const_cast<c10::TensorImpl*>(&new_state)));
    const int64_t cpu_bytes = cpu_state_bytes();
    const int64_t cuda_bytes = state.numel() - cpu_bytes;
    TORCH_CHECK_VALUE(state.dim() == 1 && cuda_bytes >= 0 && (cuda_bytes == 0 || has_gpu()),
                      "torch_fallback: a relay RNG state holds the CPU state (", cpu_bytes,
                      " bytes), then the CUDA state where a GPU is visible; got ", state.numel(),
                      " bytes. Pass a state from torch.relay.get_rng_state() of this machine.");
    locked(cpu_, [&](at::Generator& gen) { gen.set_state(state.narrow(0, 0, cpu_bytes)); });
    if (cuda_bytes > 0) {
      locked(cuda(), [&](at::Generator& gen) {
        gen.set_state(state.narrow(0, cpu_bytes, cuda_bytes));
      });
    }
  }

 private:
  RelayGeneratorImpl* clone_impl() const override {
    auto* copy = new RelayGeneratorImpl(index_, /*is_default=*/false);
    copy->cpu_ = cpu_.clone();
    if (cuda_) copy->cuda_ = cuda_->clone();
    return copy;
  }

  static bool has_gpu() { return cuda::device_count() > 0; }

  const at::Generator& cuda() const {
    std::call_once(cuda_once_, [this] {
      const auto& hooks = at::detail::getCUDAHooks();
      cuda_ = is_default_ ? hooks.getDefaultGenerator(index_) : hooks.getNewGenerator(index_);
      if (!is_default_) cuda_->set_current_seed(cpu_.current_seed());
    });
    return *cuda_;
  }

  template <typename F>
  void for_each(F&& f) {
    locked(cpu_, f);
    if (has_gpu()) locked(cuda(), f);
  }

  const c10::DeviceIndex index_;
  const bool is_default_;
  at::Generator cpu_;
  mutable std::once_flag cuda_once_;
  mutable std::optional<at::Generator> cuda_;
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::mutex mutex;
  static std::deque<at::Generator> generators;  // a deque: references stay valid as it grows
  if (index < 0) index = current_device();
  check_device_index(index);
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<c10::DeviceIndex>(generators.size()) <= index) {
    generators.push_back(at::make_generator<RelayGeneratorImpl>(
        static_cast<c10::DeviceIndex>(generators.size()), /*is_default=*/true));
  }
  return generators[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_device_index(index);
  return at::make_generator<RelayGeneratorImpl>(index, /*is_default=*/false);
}

at::Generator target_generator(const std::optional<at::Generator>& generator,
                               c10::DeviceIndex index, c10::Device target) {
  const at::Generator& relay_generator =
      generator && generator->defined() ? *generator : default_generator(index);
  if (relay_generator.device().type() != c10::DeviceType::PrivateUse1) return relay_generator;
  return relay_generator.get<RelayGeneratorImpl>()->for_target(target);
}

}  // namespace torch_fallback::relay
