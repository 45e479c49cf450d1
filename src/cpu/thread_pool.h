// A small persistent pool of std::threads for the CPU attention path.
//
// parallel_for(n, task) runs task(0..n-1) on the workers plus the calling
// thread and returns when every index is done. Indices are handed out
// dynamically (one atomic counter), so which thread runs an index varies from
// call to call; callers that need bitwise-reproducible results make each
// task's result depend only on its index, never on the thread that ran it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace waveboost::cpu {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: 1 means no workers at all.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Safe to call from several host threads at once: calls are serialized,
  // each one using the whole pool. Must not be called from inside a task.
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& task);

 private:
  void worker_loop();
  void run_tasks();  // claims indices until none are left

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time

  std::mutex mutex_;  // guards the fields below
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  uint64_t generation_ = 0;   // bumped once per parallel_for
  int workers_finished_ = 0;  // workers done with the current generation
  bool stopping_ = false;

  const std::function<void(int64_t)>* task_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
};

// Threads the CPU path uses: WAVEBOOST_NUM_THREADS if set to a positive
// integer, else std::thread::hardware_concurrency() (at least 1).
int configured_num_threads();

// The process-wide pool, created on first use with configured_num_threads().
// A child process after fork() gets a fresh pool (the parent's workers do not
// exist there).
ThreadPool& global_thread_pool();

}  // namespace waveboost::cpu
