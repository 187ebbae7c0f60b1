// The connection layer under `megakernel serve`: cpp-httplib 0.11 (Debian's compiled library) reads
// a request with a timeout per socket read only, so a client trickling a byte every few seconds
// held a connection thread for ever, and its fixed thread pool let a handful of such clients stall
// everyone else. HttpServer keeps cpp-httplib's request parsing and routing
// (Server::process_request) but runs each connection itself:
// - a whole-request read limit (MK_SERVE_REQUEST_READ_MS, default 30 s) from the first byte of a
//   request to the end of its body, answered with 408 and the connection closed;
// - ConnectionPool: threads grow on demand (up to kMaxConnectionThreads) so that slow or idle
//   connections do not hold back new ones, and shrink back when idle;
// - stop_idle(): idle keep-alive connections close at once (the listener is closed at SIGTERM);
//   hard_stop(): every read and write fails at once (the drain limit has passed).
// Writes keep cpp-httplib's semantics (a write checks that the peer has not closed, which is how a
// client that left is noticed: docs/serve.md).
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mk::cli {

// Most connection threads at once; connections beyond wait in a queue.
inline constexpr size_t kMaxConnectionThreads = 1024;

// httplib::TaskQueue with at least `min_threads` threads and up to `max_threads`: a job that finds
// no idle thread starts one; threads above the minimum end after `idle_limit` without work.
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t min_threads, size_t max_threads,
                 std::chrono::milliseconds idle_limit = std::chrono::milliseconds(10000));
  ~ConnectionPool() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;  // runs the queued jobs, then joins every thread
  size_t threads() const;

 private:
  void spawn_locked();
  void worker(std::list<std::thread>::iterator self);
  void join_retired_locked(std::unique_lock<std::mutex>& lock);

  const size_t min_threads_, max_threads_;
  const std::chrono::milliseconds idle_limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> retired_;
  size_t idle_ = 0, live_ = 0;
  bool shutdown_ = false;
};

class HttpServer : public httplib::Server {
 public:
  HttpServer();
  ~HttpServer() override;
  // Longest time from the first byte of a request to the end of its body (0 = no limit).
  std::chrono::milliseconds request_read_limit{30000};
  // Connections waiting for their next request close now; requests in progress go on.
  void stop_idle();
  // Every read and write of every connection fails from now on.
  void hard_stop();
  bool hard_stopped() const { return hard_stopped_; }
  // From the logger (the thread that answers the request): the connection closes after this
  // response (one refused before its body was read: the body's bytes must never be parsed as the
  // next request).
  static void close_after_response();
  // From the logger: this request was not read in time (answered 408, not the 400 cpp-httplib
  // reports for the read that failed).
  static bool request_timed_out();
  // 408 replies sent for requests not read in time: also those whose request line never completed,
  // which cpp-httplib does not log.
  uint64_t timeouts_sent() const { return timeouts_sent_.load(); }
  void count_timeout() { ++timeouts_sent_; }
  // From the logger: the client closed its side before its request was complete (cpp-httplib
  // reports that read as a malformed request, 400).
  static bool client_left();
  int stop_fd(bool hard) const { return hard ? hard_pipe_[0] : idle_pipe_[0]; }
  std::chrono::milliseconds read_timeout() const;
  std::chrono::milliseconds write_timeout() const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  int idle_pipe_[2] = {-1, -1}, hard_pipe_[2] = {-1, -1};
  std::atomic<bool> idle_stopped_{false}, hard_stopped_{false};
  std::atomic<uint64_t> timeouts_sent_{0};
};

}  // namespace mk::cli
