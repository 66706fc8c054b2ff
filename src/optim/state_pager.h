// The optimizer state of one rank on a drive (--state-dir, docs/state_dir.md), paged through a
// few staging slots: a chunk of elements [begin, end) with its master weights, m and v (and q8
// block maxima) is one 4 KiB-aligned record of the state file, read into a slot when the update
// reaches it (or ahead of it), updated there, and written behind. Records carry CRC-32C checksums
// kept in memory, so a chunk changed on the drive between steps is caught when read.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pinned_memory/host_buffer.h"
#include "state_io/io_queue.h"
#include "state_io/state_file.h"

namespace zo::optim {

// Defaults: 4 Mi elements a chunk (24 MiB of fp32 master + q8 moments), 4 staging slots (the
// chunk being updated, the next one being read, the last one being written, one spare).
inline constexpr std::size_t kDefaultChunkElements = std::size_t{1} << 22;
inline constexpr std::size_t kDefaultStagingSlots = 4;

// Local elements [begin, end) of one tensor in one owned range, whose q8 blocks are numbered from
// `block` (HostOptimizer::Segment without its decay flag).
struct SegmentSpan {
  std::size_t begin, end, block;
};

// One chunk: local elements [begin, end) and q8 blocks [block_begin, block_end).
struct ChunkSpan {
  std::size_t begin, end, block_begin, block_end;
  bool operator==(const ChunkSpan&) const = default;
};

// Cuts the segments (ascending, back to back from 0) into chunks of at most max_elements (at
// least one q8 block) that never split a q8 block: a chunk ends at a segment's end or at a block
// boundary inside it.
std::vector<ChunkSpan> plan_chunks(std::span<const SegmentSpan> segments, std::size_t max_elements);

// Bytes per element of each array of a record, and whether q8 block maxima come along.
struct StateShape {
  std::size_t master_bytes = 4;  // fp32 or bf16 master
  std::size_t moment_bytes = 4;  // fp32, bf16 or q8 m and v
  bool q8 = false;               // + m and v block maxima (fp32 each)
};

// Where a chunk's arrays sit in its record: byte offsets of m, v and the two block-maxima arrays
// (the master first, at 0), and the record's 4 KiB-aligned size.
struct RecordLayout {
  std::size_t m, v, m_absmax, v_absmax, bytes;
};
RecordLayout record_layout(const ChunkSpan& c, const StateShape& shape);

// For the plan: the file a pager of these chunks makes, and one staging slot (the largest record).
struct PagerBytes {
  std::uint64_t file = 0;
  std::size_t slot = 0;
};
PagerBytes pager_bytes(const std::vector<ChunkSpan>& chunks, const StateShape& shape);

class StatePager {
 public:
  // One chunk's arrays in a slot (element 0 is the chunk's `begin`).
  struct View {
    void* master;
    void* m;
    void* v;
    float* m_absmax;  // q8 only, else null
    float* v_absmax;
    std::size_t n, blocks;
  };
  // Fills a chunk that was never written (the starting state: zero moments, the master set later).
  using Fresh = std::function<void(const ChunkSpan&, const View&)>;
  // One finished transfer between a slot and the drive (for --trace): when it was queued, when
  // the queue saw it done (io_uring sees it when next used, so a span may run long), and when
  // the pager waited for it (it stood waiting where completed > wait_began).
  struct Transfer {
    bool write = false;
    std::size_t chunk = 0, slot = 0, bytes = 0;
    std::chrono::steady_clock::time_point submitted, completed, wait_began, wait_ended;
  };
  using Observer = std::function<void(const Transfer&)>;

  struct Options {
    std::filesystem::path dir;
    std::size_t slots = 4;  // staging slots, each the size of the largest record
    state_io::FileOptions file;
    state_io::QueueOptions queue;
  };

  StatePager(std::vector<ChunkSpan> chunks, StateShape shape, Fresh fresh, const Options& o);
  ~StatePager();
  StatePager(const StatePager&) = delete;
  StatePager& operator=(const StatePager&) = delete;

  const std::vector<ChunkSpan>& chunks() const { return chunks_; }
  std::size_t record_bytes(std::size_t c) const { return records_[c].at.bytes; }
  std::uint64_t file_bytes() const { return file_.size(); }
  std::size_t slot_bytes() const { return slot_bytes_; }
  // What the log says once: the queue ("io_uring", or why threads) and the file's I/O mode.
  std::string describe() const;

  // Starts reading chunk c into a free slot (a cached one, or one whose write is the oldest, once
  // done); nothing when it is in memory or on its way, or every other slot is held or being read.
  void prefetch(std::size_t c);
  // Chunks a reader may prefetch ahead of the one it holds: every slot but the held one and one
  // being written.
  std::size_t read_ahead() const { return slots_.size() - 2; }
  // Chunk c's arrays, read (and checked) if they are not in memory. Throws state_io::IoError
  // for a failed read or a chunk that changed on the drive. Valid until release(c).
  View acquire(std::size_t c);
  // Done with chunk c for now. A dirty chunk stays in its slot until an acquire of another chunk
  // (the update has moved on: a chunk holding many small tensors is written once a step, not once
  // per tensor), then is written behind; its slot is reused once the write is done.
  void release(std::size_t c, bool dirty);
  // Waits for every write: afterwards the file holds every released chunk. Throws for a write that
  // failed.
  void flush();

  // Called on the pager's thread for every transfer once it is waited for; must not throw.
  void observe(Observer o) { observer_ = std::move(o); }

  // Bytes read from and written to the drive so far.
  std::uint64_t bytes_read() const { return bytes_read_; }
  std::uint64_t bytes_written() const { return bytes_written_; }

 private:
  struct Record {
    std::uint64_t offset;
    RecordLayout at;
  };
  enum class SlotState : std::uint8_t { kFree, kReading, kHeld, kCached, kWriting };
  struct Slot {
    pinned::HostBuffer buffer;
    SlotState state = SlotState::kFree;
    std::size_t chunk = 0;
    std::uint64_t ticket = 0;
    std::uint64_t last_use = 0;
    bool dirty = false;  // cached, changed since the drive's copy
    std::chrono::steady_clock::time_point submitted;
  };

  View view(std::size_t c, Slot& s);
  // A slot for a new chunk: free, else the least recently used cached one, else the oldest write
  // once done, else the oldest prefetch once read. Null when every slot is held.
  Slot* take_slot();
  void finish_write(Slot& s);
  void finish_read(Slot& s);
  // Queues slot s's transfer of its chunk's record.
  void submit(Slot& s, bool write);
  // Waits for slot s's transfer and tells the observer.
  void wait(Slot& s, bool write);
  // Queues the writes of every dirty cached slot but chunk `keep`'s.
  void write_behind(std::size_t keep);
  std::vector<std::uint32_t> checksums(const Slot& s) const;
  Slot* slot_of(std::size_t c);

  std::vector<ChunkSpan> chunks_;
  StateShape shape_;
  Fresh fresh_;
  std::vector<Record> records_;
  std::size_t slot_bytes_ = 0;
  state_io::StateFile file_;
  std::unique_ptr<state_io::IoQueue> queue_;
  std::string queue_note_;
  std::vector<Slot> slots_;
  // Per chunk, of its last write: one CRC-32C per kCrcPiece bytes of the record, computed in
  // parallel (a whole record's one CRC would put a single core on the update's path).
  std::vector<std::vector<std::uint32_t>> crc_;
  std::vector<bool> written_;  // per chunk: on the drive (else fresh)
  std::uint64_t clock_ = 0, bytes_read_ = 0, bytes_written_ = 0;
  Observer observer_;
};

}  // namespace zo::optim
