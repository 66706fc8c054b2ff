// The MPI communicator (OpenMPI from Debian). Non-blocking collectives polled against a deadline
// give every call a timeout; MPI_ERRORS_RETURN turns MPI failures into exceptions.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "comm/comm.h"

#ifdef ZO_HAVE_MPI
#include <mpi.h>
#endif

namespace zo::comm {

#ifndef ZO_HAVE_MPI

bool mpi_available() {
  return false;
}

void abort_job(int) noexcept {}

std::unique_ptr<Communicator> make_mpi_comm(double) {
  throw CommError(
      "this build has no MPI: install libopenmpi-dev and openmpi-bin (Debian) and "
      "re-run cmake, or run a single process");
}

#else

namespace {

// MPI is initialised once per process and finalised at exit (after every communicator is gone).
struct MpiRuntime {
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // MULTIPLE: the main loop and the engine's gradient and parameter streams (threads on the
      // host backend) each issue collectives on their own communicator, concurrently.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        throw CommError("MPI_Init_thread failed: is this process started by mpirun?");
      }
      owned = true;
      if (provided < MPI_THREAD_MULTIPLE) {
        throw CommError(
            "this MPI library does not support MPI_THREAD_MULTIPLE (concurrent collectives "
            "from several threads); use Debian's OpenMPI (libopenmpi-dev)");
      }
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized) MPI_Finalize();
  }
  bool owned = false;
};

void ensure_mpi() {
  static MpiRuntime runtime;
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

int checked_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw CommError(std::string(what) + ": " + std::to_string(n) +
                    " elements per rank exceed MPI's int count; use smaller buckets");
  }
  return static_cast<int>(n);
}

class MpiComm final : public Communicator {
 public:
  MpiComm(double timeout_s, MPI_Comm parent) : timeout_s_(timeout_s) {
    if (!(timeout_s > 0.0)) throw std::invalid_argument("MPI communicator: timeout must be > 0");
    ensure_mpi();
    check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    const RankInfo info = rank_info_from_env();
    if (info.size != size_) {
      throw CommError(info.source + " says " + std::to_string(info.size) + " ranks but MPI sees " +
                      std::to_string(size_) + ": start the job with mpirun -np " +
                      std::to_string(info.size));
    }
    local_rank_ = info.local_rank;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    name_ = "MPI (" + v.substr(0, v.find(',')) + ")";
  }

  ~MpiComm() override {
    // A collective abandoned by a timeout may still complete if the late ranks arrive; wait a
    // little so MPI can free it, then let go (MPI_Finalize or process exit cleans up).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (MPI_Request& r : abandoned_) {
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (!done) return;  // a rank is gone: freeing the communicator could hang
    }
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  std::string name() const override { return name_; }

  void all_reduce(double* data, std::size_t n, ReduceOp op) override {
    reduce_all(data, n, MPI_DOUBLE, sizeof(double), op);
  }
  void all_reduce(float* data, std::size_t n, ReduceOp op) override {
    reduce_all(data, n, MPI_FLOAT, sizeof(float), op);
  }

  void reduce_scatter(const float* in, float* out, std::size_t count) override {
    const int c = checked_count(count, "reduce_scatter");
    run("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in, out, c, MPI_FLOAT, MPI_SUM, comm_, r);
    });
  }

  void all_gather(const void* in, void* out, std::size_t bytes) override {
    const int c = checked_count(bytes, "all_gather");
    run("all_gather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, c, MPI_BYTE, out, c, MPI_BYTE, comm_, r);
    });
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_) {
      throw std::invalid_argument("broadcast: root " + std::to_string(root) + " of " +
                                  std::to_string(size_));
    }
    auto* p = static_cast<char*>(data);
    std::size_t done = 0;
    do {  // in INT_MAX-byte pieces; one (empty) call for 0 bytes
      const std::size_t chunk = std::min<std::size_t>(bytes - done, INT_MAX);
      run("broadcast", [&](MPI_Request* r) {
        return MPI_Ibcast(p + done, static_cast<int>(chunk), MPI_BYTE, root, comm_, r);
      });
      done += chunk;
    } while (done < bytes);
  }

  void barrier() override {
    run("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  std::unique_ptr<Communicator> duplicate() override {
    // MPI_Comm_dup is blocking; a barrier with our timeout first makes sure every rank is here.
    barrier();
    return std::make_unique<MpiComm>(timeout_s_, comm_);
  }

 private:
  void check(int code, const char* what) const {
    if (code != MPI_SUCCESS) {
      throw CommError("rank " + std::to_string(rank_) + ": " + what +
                      " failed: " + mpi_error(code));
    }
  }

  void reduce_all(void* data, std::size_t n, MPI_Datatype type, std::size_t esize, ReduceOp op) {
    auto* p = static_cast<char*>(data);
    for (std::size_t done = 0; done < n;) {
      const std::size_t chunk = std::min<std::size_t>(n - done, INT_MAX);
      run("all_reduce", [&](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, p + done * esize, static_cast<int>(chunk), type,
                              op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comm_, r);
      });
      done += chunk;
    }
  }

  // Starts a non-blocking collective and polls it until done or the deadline.
  template <class Start>
  void run(const char* what, Start&& start) {
    if (broken_) {
      throw CommError("rank " + std::to_string(rank_) + ": " + what +
                      " on a communicator that timed out earlier; the job must stop");
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(start(&r), what);
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + std::chrono::duration<double>(timeout_s_);
    int done = 0;
    for (int spins = 0;; ++spins) {
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) break;
      // Spin briefly (collectives on a quiet machine finish in microseconds), then back off.
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    abandoned_.push_back(r);
    broken_ = true;
    char limit[32];
    std::snprintf(limit, sizeof limit, "%.1f", timeout_s_);
    throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + what +
                    " did not complete within " + limit +
                    " s: another rank has died, stopped, or runs a different configuration");
  }

  double timeout_s_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  std::string name_;
  bool broken_ = false;
  std::vector<MPI_Request> abandoned_;
};

}  // namespace

bool mpi_available() {
  return true;
}

void abort_job(int exit_code) noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

std::unique_ptr<Communicator> make_mpi_comm(double timeout_s) {
  ensure_mpi();
  return std::make_unique<MpiComm>(timeout_s, MPI_COMM_WORLD);
}

#endif

}  // namespace zo::comm
