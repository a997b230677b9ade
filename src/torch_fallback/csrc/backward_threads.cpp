// The OpenMP threads of a backend's backward. The autograd engine runs a
// backend's backward on a thread of its own (one per backend device), where it
// runs a CPU tensor's backward on the thread that called backward(). A CPU
// kernel on that thread starts an OpenMP team of its own, whose threads then
// wait beside those of the main thread's team; with more OpenMP threads than
// CPUs, libgomp stops spinning at its barriers, and every parallel region of
// the main thread sleeps and wakes its threads from then on (pytorch/pytorch#8280):
// BERT's inference on two CPUs ran 3x slower after one relay backward. Once
// the backward ends, the fallback lets that thread's team go.
#include "call_support.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

namespace torch_fallback::detail {
namespace {

// omp_pause_resource_all of the OpenMP runtime PyTorch loaded (OpenMP 5.0), or
// null where there is none or it is older.
using PauseAll = int (*)(int kind);

PauseAll pause_all() {
#if defined(__linux__) || defined(__APPLE__)
  static const auto pause =
      reinterpret_cast<PauseAll>(dlsym(RTLD_DEFAULT, "omp_pause_resource_all"));
  return pause;
#else
  return nullptr;
#endif
}

constexpr int kPauseSoft = 1;  // omp_pause_soft: the threads go, the settings stay

}  // namespace

void release_openmp_team_after_backward() {
  // The engine's backend threads are never the thread that loaded the library.
  if (std::this_thread::get_id() == g_loading_thread) return;
  const int graph_task = torch::autograd::get_current_graph_task_id();
  thread_local int registered_for = -1;
  if (graph_task == -1 || graph_task == registered_for) return;
  const PauseAll pause = pause_all();
  if (pause == nullptr) return;
  registered_for = graph_task;
  // Final callbacks run on the thread that finishes the backward: the team is
  // let go only where it is this thread's (a team is its master thread's).
  const std::thread::id self = std::this_thread::get_id();
  torch::autograd::Engine::get_default_engine().queue_callback([self, pause] {
    if (std::this_thread::get_id() == self) pause(kPauseSoft);
  });
}

}  // namespace torch_fallback::detail
