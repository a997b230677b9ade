#include "op_rules.h"

#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "settings.h"

namespace torch_fallback {
namespace {

// Kernels that write arguments their schemas do not mark as mutable. A
// zero-copy fallback sees those writes; a copying one must copy them back.
const std::unordered_map<std::string, std::vector<std::string>>& hidden_mutation_table() {
  static const std::unordered_map<std::string, std::vector<std::string>> table{
      // batch_norm, instance_norm and _batch_norm_impl_index are composites
      // that reach the fallback as native_batch_norm.
      {"aten::native_batch_norm", {"running_mean", "running_var"}},
      {"aten::cudnn_batch_norm", {"running_mean", "running_var"}},
      {"aten::miopen_batch_norm", {"running_mean", "running_var"}},
      // SyncBatchNorm's: the ranks' statistics combined, the running ones updated.
      {"aten::batch_norm_gather_stats", {"running_mean", "running_var"}},
      {"aten::batch_norm_gather_stats_with_counts", {"running_mean", "running_var"}},
      {"aten::batch_norm_update_stats", {"running_mean", "running_var"}},
      {"aten::_cudnn_rnn", {"dropout_state"}},
      {"aten::rrelu_with_noise", {"noise"}},
  };
  return table;
}

// Tensor arguments that CUDA's kernels take from the CPU as they come: the nested
// sizes that to_padded_tensor's backward passes to _nested_from_padded, which
// they read on the host, and bernoulli_'s probabilities, which they move.
const std::unordered_map<std::string, std::vector<std::string>>& host_read_table() {
  static const std::unordered_map<std::string, std::vector<std::string>> table{
      {"aten::_nested_from_padded", {"cpu_nested_shape_example"}},
      {"aten::bernoulli_.Tensor", {"p"}},
  };
  return table;
}

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// Ops whose results are sparse or quantized tensors, by name.
std::string unservable_result_of(const std::string& name) {
  const std::string bare = name.substr(name.find("::") + 2);
  if (bare.find("sparse") != std::string::npos && bare.find("semi_structured") == std::string::npos) {
    return "sparse";
  }
  for (const char* prefix : {"quantize_per", "_make_per_", "to_mkldnn"}) {
    if (starts_with(bare, prefix)) return bare.find("mkldnn") != std::string::npos ? "mkldnn" : "quantized";
  }
  return {};
}

// Ops whose CUDA kernels take CPU indices besides CUDA tensors.
bool indexing_op(const std::string& name) {
  for (const char* op : {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl",
                         "aten::_index_put_impl_", "aten::_unsafe_index", "aten::_unsafe_index_put"}) {
    if (name == op) return true;
  }
  return false;
}

// In-place ops keep their argument's shape; these change it (and its memory).
bool resizes_its_arguments(const std::string& name) {
  const std::string bare = name.substr(name.find("::") + 2);
  return bare.find("resize") != std::string::npos || starts_with(bare, "set_");
}

std::mutex g_device_checked_mutex;
std::unordered_set<std::string>& device_checked() {
  static auto* const names = new std::unordered_set<std::string>();
  return *names;
}

bool cuda_checks_devices(const std::string& full_name) {
  std::lock_guard<std::mutex> lock(g_device_checked_mutex);
  return device_checked().count(full_name) > 0;
}

std::unique_ptr<OpRules> make_rules(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  auto rules = std::make_unique<OpRules>();
  rules->name = schema.operator_name().name;
  rules->overload = schema.operator_name().overload_name;
  rules->full_name = rules->overload.empty() ? rules->name : rules->name + "." + rules->overload;
  const auto& args = schema.arguments();
  const auto& table = hidden_mutation_table();
  if (const auto it = table.find(rules->name); it != table.end()) {
    for (const auto& arg_name : it->second) {
      const auto index = schema.argumentIndexWithName(arg_name);
      if (!index) continue;
      const auto* alias = args[*index].alias_info();
      if (alias == nullptr || !alias->isWrite()) rules->hidden_mutations.push_back(*index);
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite()) rules->written_arguments.push_back(i);
  }
  rules->written_arguments.insert(rules->written_arguments.end(), rules->hidden_mutations.begin(),
                                  rules->hidden_mutations.end());
  const bool resizes = resizes_its_arguments(rules->name);
  for (size_t i : rules->written_arguments) {
    if (resizes || args[i].is_out()) rules->resizable_arguments.push_back(i);
  }
  bool takes_a_device = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& type = args[i].real_type();
    const auto kind = type->kind() == c10::TypeKind::OptionalType
                          ? type->expectRef<c10::OptionalType>().getElementType()->kind()
                          : type->kind();
    if (kind == c10::TypeKind::ScalarTypeType) rules->dtype_arguments.push_back(i);
    if (kind == c10::TypeKind::LayoutType) rules->layout_arguments.push_back(i);
    if (kind == c10::TypeKind::GeneratorType) rules->generator_arguments.push_back(i);
    takes_a_device = takes_a_device || kind == c10::TypeKind::DeviceObjType;
  }
  for (const auto& ret : schema.returns()) {
    const auto* alias = ret.alias_info();
    rules->returns_a_view = rules->returns_a_view || (alias != nullptr && !alias->isWrite());
  }
  rules->unservable_result = unservable_result_of(rules->name);
  rules->takes_cpu_indices = indexing_op(rules->name);
  rules->takes_no_cpu_scalars = cuda_checks_devices(rules->full_name);
  if (const auto it = host_read_table().find(rules->full_name); it != host_read_table().end()) {
    for (const auto& arg_name : it->second) {
      if (const auto index = schema.argumentIndexWithName(arg_name)) {
        rules->host_read_arguments.push_back(*index);
      }
    }
  }
  rules->is_foreach = starts_with(rules->name, "aten::_foreach_");
  rules->copies_between_devices = starts_with(rules->name, "aten::_foreach_copy");
  // A DirectCall checks CPU tensors among the arguments by their values. Its
  // views are the backend's memory, so hidden writes (batch norm's running
  // statistics) land there as they do in eager.
  // The kernels of arange's and where's out= forms (ArangeKernel, WhereOutKernel)
  // size their output before, so that the target kernel resizes nothing.
  const bool sized_by_kernel =
      rules->full_name == "aten::arange.start_out" || rules->full_name == "aten::where.self_out";
  // A generator is swapped for the target's as the boxed fallback swaps it.
  rules->runs_direct = (rules->resizable_arguments.empty() || sized_by_kernel) &&
                       rules->layout_arguments.empty() && !takes_a_device &&
                       !rules->returns_a_view && rules->unservable_result.empty();
  rules->reads_on_home = rules->full_name == "aten::_local_scalar_dense";
  using c10::DispatchKey;
  rules->has_cpu_kernel = op.hasComputedKernelForDispatchKey(DispatchKey::CPU);
  rules->has_cuda_kernel = op.hasComputedKernelForDispatchKey(DispatchKey::CUDA);
  rules->has_nested_cpu_kernel = op.hasComputedKernelForDispatchKey(DispatchKey::NestedTensorCPU);
  rules->has_nested_cuda_kernel =
      op.hasComputedKernelForDispatchKey(DispatchKey::NestedTensorCUDA);
  rules->cpu_decomposition = torch_fallback::cpu_decomposition(rules->full_name);
  rules->cuda_runner = torch_fallback::cuda_runner(rules->full_name);
  rules->cpu_runner = torch_fallback::cpu_runner(rules->full_name);
  rules->counters = metrics::counters_for(rules->full_name);
  return rules;
}

}  // namespace

namespace {

// Made once per op, under a lock; never freed, as kernels may run while the
// process exits. Schemas live as long as the process.
const OpRules& process_op_rules(const c10::OperatorHandle& op) {
  static std::mutex mutex;
  static auto* const all =
      new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpRules>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& rules = (*all)[&op.schema()];
  if (!rules) rules = make_rules(op);
  return *rules;
}

}  // namespace

const OpRules& op_rules(const c10::OperatorHandle& op) {
  // Looked up per thread, so that the boxed fallback's calls take no lock.
  thread_local std::unordered_map<const c10::FunctionSchema*, const OpRules*> cache;
  const OpRules*& rules = cache[&op.schema()];
  if (rules == nullptr) rules = &process_op_rules(op);
  return *rules;
}

void set_cuda_device_checked_ops(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(g_device_checked_mutex);
  device_checked() = std::unordered_set<std::string>(names.begin(), names.end());
}

uint64_t OpRules::look_up_cpu_ops(uint64_t generation) const {
  const bool forced = torch_fallback::forced_to_cpu(name, full_name);
  const uint64_t cached = generation << 1U | (forced ? 1U : 0U);
  forced_to_cpu_cache_.store(cached, std::memory_order_relaxed);
  return cached;
}

}  // namespace torch_fallback
