// state_io: the optimizer state's files. Every transfer is checked against the bytes written,
// on both queues (io_uring where the kernel allows it, the pread/pwrite threads always), and
// every failure path runs through the queues' real completion handling via the test hook.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "run_binary.h"
#include "state_io/io_queue.h"
#include "state_io/state_file.h"

namespace {

namespace fs = std::filesystem;
using zo::state_io::IoError;
using zo::state_io::IoQueue;
using zo::state_io::IoRequest;
using zo::state_io::kAlignment;
using zo::state_io::QueueKind;
using zo::state_io::QueueOptions;
using zo::state_io::StateFile;

struct Free {
  void operator()(void* p) const noexcept { std::free(p); }
};
using Aligned = std::unique_ptr<std::uint8_t, Free>;
Aligned aligned(std::size_t bytes) {
  return Aligned(static_cast<std::uint8_t*>(std::aligned_alloc(kAlignment, bytes)));
}

// The queues this machine has: the threads always, io_uring where the kernel allows it.
std::vector<QueueKind> queue_kinds() {
  std::vector<QueueKind> kinds{QueueKind::kThreads};
  try {
    (void)zo::state_io::make_io_queue({.kind = QueueKind::kUring, .hook = {}});
    kinds.push_back(QueueKind::kUring);
  } catch (const IoError& e) {
    std::printf("io_uring not tested here: %s\n", e.what());
  }
  return kinds;
}

// Writes `chunks` pieces of random data (4 KiB multiples of varying size) with `depth` ring
// entries, waits in reverse order, reads them back into fresh buffers and compares.
void round_trip(const StateFile& f, QueueOptions o, int chunks, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const auto q = zo::state_io::make_io_queue(o);
  struct Piece {
    std::uint64_t offset;
    std::size_t bytes;
    Aligned out, in;
  };
  std::vector<Piece> pieces;
  std::uint64_t offset = 0;
  for (int i = 0; i < chunks; ++i) {
    const std::size_t bytes = kAlignment * (1 + rng() % 9);
    if (offset + bytes > f.size()) break;
    Piece p{offset, bytes, aligned(bytes), aligned(bytes)};
    for (std::size_t b = 0; b < bytes; ++b)
      p.out.get()[b] = std::uint8_t(rng());
    pieces.push_back(std::move(p));
    offset += bytes + kAlignment * (rng() % 3);
  }
  std::vector<std::uint64_t> tickets;
  for (Piece& p : pieces)
    tickets.push_back(q->submit({IoRequest::Op::kWrite, &f, p.offset, p.out.get(), p.bytes}));
  for (auto t = tickets.rbegin(); t != tickets.rend(); ++t)
    q->wait(*t);
  tickets.clear();
  const auto submitted = std::chrono::steady_clock::now();
  for (Piece& p : pieces)
    tickets.push_back(q->submit({IoRequest::Op::kRead, &f, p.offset, p.in.get(), p.bytes}));
  for (const std::uint64_t t : tickets) {
    const auto completed = q->wait(t);  // for traces: when the queue saw it done
    EXPECT_GE(completed, submitted);
    EXPECT_LE(completed, std::chrono::steady_clock::now());
  }
  for (const Piece& p : pieces)
    ASSERT_EQ(std::memcmp(p.in.get(), p.out.get(), p.bytes), 0) << q->name() << " at " << p.offset;
}

TEST(StateIo, TheFileIsUnnamedPreallocatedAndLeavesNothingBehind) {
  const zo::test::TempDir d{"zo_state_io_"};
  {
    const StateFile f = StateFile::create(d.path, (1 << 20) + 1);
    EXPECT_EQ(f.size(), (1u << 20) + kAlignment) << "rounded up to 4 KiB";
    EXPECT_TRUE(fs::is_empty(d.path)) << "no name in the directory, even while open";
    struct stat st {};
    ASSERT_EQ(::fstat(f.fd(), &st), 0);
    EXPECT_GE(std::uint64_t(st.st_blocks) * 512, f.size()) << "the space is allocated up front";
    EXPECT_NE(f.name().find(d.path.string()), std::string::npos);
    // ext4 (this machine's /tmp) takes O_DIRECT.
    EXPECT_TRUE(f.direct()) << f.note();
  }
  EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(StateIo, EveryQueueReturnsWhatWasWritten) {
  const zo::test::TempDir d{"zo_state_io_"};
  for (const bool direct : {true, false}) {
    const StateFile f = StateFile::create(d.path, 1 << 20, {.direct = direct});
    EXPECT_EQ(f.direct(), direct) << f.note();
    for (const QueueKind k : queue_kinds()) {
      SCOPED_TRACE(int(k));
      // 4 ring entries for 20 requests: most wait in the backlog.
      round_trip(f, {.kind = k, .depth = 4, .threads = 3, .hook = {}}, 20, 7 + unsigned(direct));
    }
  }
  // Synchronous transfers see what the queues wrote, and the other way round.
  const StateFile f = StateFile::create(d.path, 64 * kAlignment);
  const Aligned out = aligned(8 * kAlignment), in = aligned(8 * kAlignment);
  for (std::size_t i = 0; i < 8 * kAlignment; ++i)
    out.get()[i] = std::uint8_t(i * 7 + 3);
  f.write(16 * kAlignment, out.get(), 8 * kAlignment);
  const auto q = zo::state_io::make_io_queue();
  q->wait(q->submit({IoRequest::Op::kRead, &f, 16 * kAlignment, in.get(), 8 * kAlignment}));
  EXPECT_EQ(std::memcmp(in.get(), out.get(), 8 * kAlignment), 0);
}

TEST(StateIo, ShortTransfersAreContinued) {
  const zo::test::TempDir d{"zo_state_io_"};
  const StateFile f = StateFile::create(d.path, 1 << 20);
  for (const QueueKind k : queue_kinds()) {
    int calls = 0;
    // Every system transfer moves at most one 4 KiB block.
    auto hook = [&calls](const IoRequest&, long result) {
      ++calls;
      return result > long(kAlignment) ? long(kAlignment) : result;
    };
    round_trip(f, {.kind = k, .depth = 8, .threads = 1, .hook = hook}, 12, 3);
    EXPECT_GT(calls, 24) << "more system transfers than requests";
  }
}

TEST(StateIo, FailuresNameTheFileThePlaceAndTheFix) {
  const zo::test::TempDir d{"zo_state_io_"};
  const StateFile f = StateFile::create(d.path, 1 << 20);
  const Aligned buf = aligned(4 * kAlignment);
  std::memset(buf.get(), 1, 4 * kAlignment);
  for (const QueueKind k : queue_kinds()) {
    for (const auto& [error, words] :
         {std::pair{-EIO, "smartctl"}, {-ENOSPC, "the drive is full"}, {0L, "moved no bytes"}}) {
      // The transfer at byte 8192 fails; the one before it does not.
      auto hook = [error = error](const IoRequest& part, long result) {
        return part.offset == 2 * kAlignment ? error : result;
      };
      const auto q = zo::state_io::make_io_queue({.kind = k, .threads = 1, .hook = hook});
      const std::uint64_t good = q->submit({IoRequest::Op::kWrite, &f, 0, buf.get(), kAlignment});
      const std::uint64_t bad =
          q->submit({IoRequest::Op::kWrite, &f, 2 * kAlignment, buf.get(), kAlignment});
      try {
        q->wait(bad);
        ADD_FAILURE() << "no error from " << q->name();
      } catch (const IoError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("the state file in " + d.path.string()), std::string::npos) << m;
        EXPECT_NE(m.find("write at byte 8192 (4096 bytes)"), std::string::npos) << m;
        EXPECT_NE(m.find(words), std::string::npos) << m;
      }
      EXPECT_NO_THROW(q->wait(good)) << "another request is not affected";
      // The queue goes on working.
      EXPECT_NO_THROW(q->wait(q->submit({IoRequest::Op::kRead, &f, 0, buf.get(), kAlignment})));
    }
  }
}

TEST(StateIo, MisalignedOrOutOfRangeTransfersAreRefused) {
  const zo::test::TempDir d{"zo_state_io_"};
  const StateFile f = StateFile::create(d.path, 16 * kAlignment);
  const Aligned buf = aligned(2 * kAlignment);
  const auto q = zo::state_io::make_io_queue();
  EXPECT_THROW(q->submit({IoRequest::Op::kRead, &f, 100, buf.get(), kAlignment}),
               std::invalid_argument);
  EXPECT_THROW(q->submit({IoRequest::Op::kRead, &f, 0, buf.get() + 8, kAlignment}),
               std::invalid_argument);
  EXPECT_THROW(q->submit({IoRequest::Op::kRead, &f, 0, buf.get(), 100}), std::invalid_argument);
  EXPECT_THROW(q->submit({IoRequest::Op::kRead, &f, 15 * kAlignment, buf.get(), 2 * kAlignment}),
               std::invalid_argument);
  EXPECT_THROW(f.write(0, buf.get(), 0), std::invalid_argument);
}

TEST(StateIo, AFileSizeLimitIsFoundBeforeTraining) {
  const zo::test::TempDir d{"zo_state_io_"};
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    (void)StateFile::create(d.path, 2 << 20);
  } catch (const IoError& e) {
    message = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_NE(message.find("ulimit -f"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(StateIo, ABadDirectoryIsNamed) {
  const zo::test::TempDir d{"zo_state_io_"};
  auto error = [](const fs::path& p) {
    try {
      (void)StateFile::create(p, kAlignment);
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error(d.path / "missing").find("does not exist"), std::string::npos);
  const fs::path file = d.path / "a_file";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("user data", f);
  std::fclose(f);
  EXPECT_NE(error(file).find("is not a directory"), std::string::npos);
  EXPECT_EQ(fs::file_size(file), 9u) << "an existing file is never touched";
}

TEST(StateIo, TmpfsWorksBufferedOrDirect) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const StateFile f = StateFile::create("/dev/shm", 256 * kAlignment);
  if (!f.direct()) {
    EXPECT_NE(f.note().find("O_DIRECT"), std::string::npos) << f.note();
  }
  for (const QueueKind k : queue_kinds())
    round_trip(f, {.kind = k, .hook = {}}, 10, 11);
}

TEST(StateIo, TheAutomaticQueueSaysWhyItFellBack) {
  std::string note;
  const auto q = zo::state_io::make_io_queue({}, &note);
  if (q->name() == "threads") {
    EXPECT_NE(note.find("io_uring"), std::string::npos) << note;
  } else {
    EXPECT_EQ(q->name(), "io_uring");
    EXPECT_TRUE(note.empty()) << note;
  }
}

}  // namespace
