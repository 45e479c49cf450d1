#include "thread_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

namespace waveboost::cpu {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run_tasks() {
  for (int64_t i = next_task_.fetch_add(1); i < num_tasks_; i = next_task_.fetch_add(1)) (*task_)(i);
}

void ThreadPool::worker_loop() {
  uint64_t seen_generation = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
    }
    run_tasks();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++workers_finished_;
    }
    work_done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)>& task) {
  if (num_tasks <= 0) return;
  // Waking a worker costs tens of microseconds; a single task is not worth it.
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) task(i);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    num_tasks_ = num_tasks;
    next_task_.store(0);
    workers_finished_ = 0;
    ++generation_;
  }
  work_ready_.notify_all();
  run_tasks();
  // Every worker checks in once per generation, so none can still be reading
  // task_ when the next call replaces it.
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return workers_finished_ == static_cast<int>(workers_.size()); });
  task_ = nullptr;
}

int configured_num_threads() {
  if (const char* env = std::getenv("WAVEBOOST_NUM_THREADS")) {
    char* end = nullptr;
    const long requested = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && requested > 0) return static_cast<int>(std::min(requested, 1024L));
  }
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

ThreadPool& global_thread_pool() {
  static std::mutex creation_mutex;
  static ThreadPool* pool = nullptr;
  static pid_t owner_pid = 0;
  std::lock_guard<std::mutex> lock(creation_mutex);
  if (pool == nullptr || owner_pid != getpid()) {
    // Never deleted on purpose: joining workers from a static destructor can
    // hang at interpreter shutdown, and after fork() the old pool's threads
    // are gone, so the only safe thing to do with it is to leave it alone.
    pool = new ThreadPool(configured_num_threads());
    owner_pid = getpid();
  }
  return *pool;
}

}  // namespace waveboost::cpu
