// Collectives between ranks. Run directly (one process: rank discovery and the single-process
// communicator; the MPI tests skip) and by ctest under `mpiexec -np 2` and `-np 3`
// (test_comm_mpi_np*), where every rank runs every test in the same order. Each rank's data is
// random from a seed that mixes its rank, so every rank can compute the expected result of
// every collective itself (in double) and compare.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"

namespace {

using zo::CommError;
using zo::comm::Communicator;
using zo::comm::ReduceOp;

bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
}

// The job-wide MPI communicator, made once (MPI is initialised once per process).
Communicator& world() {
  static const std::unique_ptr<Communicator> c = zo::comm::make_mpi_comm(60.0);
  return *c;
}

std::vector<double> rank_data(int rank, int test, std::size_t n) {
  std::mt19937_64 rng(std::uint64_t(test) * 7919 + std::uint64_t(rank) * 104729 + 17);
  std::normal_distribution<double> d(0.5, 2.0);
  std::vector<double> v(n);
  for (double& x : v)
    x = d(rng);
  return v;
}

// Sets environment variables for one test and restores them after.
class EnvGuard {
 public:
  void set(const char* name, const char* value) {
    const char* old = std::getenv(name);
    saved_.push_back({name, old ? std::optional<std::string>(old) : std::nullopt});
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~EnvGuard() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) {
        setenv(it->first.c_str(), it->second->c_str(), 1);
      } else {
        unsetenv(it->first.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(RankInfo, FromMpirunOrEnvironmentOrNothing) {
  if (under_mpirun()) GTEST_SKIP() << "changes the environment; runs in the single-process pass";
  EnvGuard env;
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "ZO_RANK",
                        "ZO_WORLD_SIZE", "ZO_LOCAL_RANK", "ZO_LOCAL_SIZE"}) {
    env.set(v, nullptr);
  }
  auto info = zo::comm::rank_info_from_env();
  EXPECT_EQ(info.size, 1);
  EXPECT_EQ(info.source, "single process");
  env.set("ZO_RANK", "3");
  env.set("ZO_WORLD_SIZE", "5");
  env.set("ZO_LOCAL_RANK", "1");
  env.set("ZO_LOCAL_SIZE", "2");
  info = zo::comm::rank_info_from_env();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.size, 5);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.source, "environment");
  env.set("OMPI_COMM_WORLD_RANK", "0");  // mpirun's variables take precedence
  env.set("OMPI_COMM_WORLD_SIZE", "2");
  info = zo::comm::rank_info_from_env();
  EXPECT_EQ(info.size, 2);
  EXPECT_EQ(info.source, "mpirun");
  env.set("OMPI_COMM_WORLD_RANK", "2");  // rank >= size
  EXPECT_THROW(zo::comm::rank_info_from_env(), std::invalid_argument);
  env.set("OMPI_COMM_WORLD_RANK", "x1");
  try {
    zo::comm::rank_info_from_env();
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='x1'"), std::string::npos);
  }
}

TEST(SingleProcessComm, CollectivesOfOneRank) {
  auto c = zo::comm::make_single_process_comm();
  EXPECT_EQ(c->size(), 1);
  const auto d = rank_data(0, 1, 37);
  std::vector<double> v = d;
  c->all_reduce(v.data(), v.size(), ReduceOp::kSum);
  EXPECT_EQ(v, d);
  std::vector<float> in(37), out(37);
  for (std::size_t i = 0; i < in.size(); ++i)
    in[i] = float(d[i]);
  c->reduce_scatter(in.data(), out.data(), in.size());
  EXPECT_EQ(out, in);
  EXPECT_THROW(c->broadcast(v.data(), 8, 1), std::invalid_argument);
  EXPECT_NO_THROW(zo::comm::check_same_on_all_ranks(*c, "config", "{\"a\":1}"));
  if (!under_mpirun()) {  // one process: the environment picks the single-process communicator
    EXPECT_EQ(zo::comm::make_comm_from_env()->name(), "single process");
  }
}

TEST(MpiComm, AllReduceSumAndMaxMatchTheReference) {
  if (!under_mpirun()) GTEST_SKIP() << "needs mpirun (ctest runs test_comm_mpi_np2/np3)";
  Communicator& c = world();
  const std::size_t n = 1001;
  std::vector<double> sum = rank_data(c.rank(), 2, n), mx = sum;
  std::vector<float> fsum(n);
  for (std::size_t i = 0; i < n; ++i)
    fsum[i] = float(sum[i]);
  c.all_reduce(sum.data(), n, ReduceOp::kSum);
  c.all_reduce(mx.data(), n, ReduceOp::kMax);
  c.all_reduce(fsum.data(), n, ReduceOp::kSum);
  std::vector<double> want_sum(n, 0.0), want_max(n, -INFINITY);
  for (int r = 0; r < c.size(); ++r) {
    const auto d = rank_data(r, 2, n);
    for (std::size_t i = 0; i < n; ++i) {
      want_sum[i] += d[i];
      want_max[i] = std::max(want_max[i], d[i]);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum[i], want_sum[i], 1e-12 * (1 + std::abs(want_sum[i])));
    ASSERT_EQ(mx[i], want_max[i]);
    ASSERT_NEAR(fsum[i], want_sum[i], 1e-5 * (1 + std::abs(want_sum[i])));
  }
}

TEST(MpiComm, ReduceScatterAllGatherAndBroadcast) {
  if (!under_mpirun()) GTEST_SKIP() << "needs mpirun";
  Communicator& c = world();
  const int P = c.size();
  const std::size_t count = 1237;  // odd, not a multiple of anything
  const auto mine = rank_data(c.rank(), 3, count * std::size_t(P));
  std::vector<float> in(mine.begin(), mine.end()), out(count);
  c.reduce_scatter(in.data(), out.data(), count);
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0.0;
    for (int r = 0; r < P; ++r)
      want += float(rank_data(r, 3, count * std::size_t(P))[std::size_t(c.rank()) * count + i]);
    ASSERT_NEAR(out[i], want, 1e-5 * (1 + std::abs(want))) << i;
  }
  // all_gather of 333 bytes per rank: exact.
  std::vector<unsigned char> part(333), all(333 * std::size_t(P));
  for (std::size_t i = 0; i < part.size(); ++i)
    part[i] = static_cast<unsigned char>(c.rank() * 31 + i * 7);
  c.all_gather(part.data(), all.data(), part.size());
  for (int r = 0; r < P; ++r)
    for (std::size_t i = 0; i < part.size(); ++i)
      ASSERT_EQ(all[std::size_t(r) * 333 + i], static_cast<unsigned char>(r * 31 + i * 7));
  // broadcast from the last rank.
  std::vector<double> b = rank_data(c.rank(), 4, 77);
  c.broadcast(b.data(), b.size() * sizeof(double), P - 1);
  EXPECT_EQ(b, rank_data(P - 1, 4, 77));
  c.barrier();
}

TEST(MpiComm, MismatchedConfigIsRefusedOnEveryRank) {
  if (!under_mpirun()) GTEST_SKIP() << "needs mpirun";
  Communicator& c = world();
  EXPECT_NO_THROW(zo::comm::check_same_on_all_ranks(c, "config", "{\"lr\":0.001}"));
  const std::string mine = c.rank() == 1 ? "{\"lr\":0.002}" : "{\"lr\":0.001}";
  try {
    zo::comm::check_same_on_all_ranks(c, "config", mine);
    ADD_FAILURE() << "no error on rank " << c.rank();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1 has {\"lr\":0.002}"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 0 has {\"lr\":0.001}"), std::string::npos) << m;
    EXPECT_NE(m.find("; start every rank with the same flags"), std::string::npos) << m;
  }
  // The caller says what to do about it.
  try {
    zo::comm::check_same_on_all_ranks(c, "the training data", mine, "use the same files");
    ADD_FAILURE() << "no error on rank " << c.rank();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks disagree on the training data"), std::string::npos) << m;
    EXPECT_NE(m.find("; use the same files"), std::string::npos) << m;
    EXPECT_EQ(m.find("same flags"), std::string::npos) << m;
  }
}

// A rank that does not arrive: the waiting ranks time out with a clear message instead of hanging,
// and their communicator refuses further work. (The late rank arrives afterwards, so the job
// itself stays healthy for the tests that follow.)
TEST(MpiComm, ACollectiveThatNeverCompletesTimesOut) {
  if (!under_mpirun()) GTEST_SKIP() << "needs mpirun";
  world().barrier();
  auto c = zo::comm::make_mpi_comm(0.5);
  if (c->rank() == 0) {
    try {
      c->barrier();
      ADD_FAILURE() << "no timeout";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("did not complete within 0.5 s"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(c->barrier(), CommError) << "a timed-out communicator is not reused";
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c->barrier();  // completes: rank 0's barrier was posted before it gave up
  }
  c.reset();
  world().barrier();
}

}  // namespace
