#include "optim/state_pager.h"

#include <algorithm>
#include <stdexcept>

#include <tbb/parallel_for.h>

#include "core/crc32c.h"
#include "cpu_adam/cpu_adam.h"

namespace zo::optim {
namespace {

constexpr std::size_t kPartAlign = 64;  // each array of a record starts on a cache line
constexpr std::size_t kCrcPiece = std::size_t{1} << 20;

std::size_t round_up(std::size_t x, std::size_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

std::vector<ChunkSpan> plan_chunks(std::span<const SegmentSpan> segments,
                                   std::size_t max_elements) {
  // Whole blocks only: max_elements rounded down to a block, at least one.
  const std::size_t limit =
      std::max(max_elements / cpu_adam::kQ8Block * cpu_adam::kQ8Block, cpu_adam::kQ8Block);
  std::vector<ChunkSpan> chunks;
  std::size_t expect = 0;
  for (const SegmentSpan& s : segments) {
    if (s.begin != expect || s.end <= s.begin) {
      throw std::invalid_argument("plan_chunks: segments must be non-empty and back to back");
    }
    expect = s.end;
    for (std::size_t b = s.begin; b < s.end;) {
      // Blocks of this segment start at s.begin + k * kQ8Block.
      const std::size_t first_block = s.block + (b - s.begin) / cpu_adam::kQ8Block;
      ChunkSpan* last = chunks.empty() ? nullptr : &chunks.back();
      if (last != nullptr && last->end == b && s.end - b + (last->end - last->begin) <= limit) {
        last->end = s.end;  // the whole rest of this segment joins the chunk
        last->block_end = s.block + cpu_adam::q8_blocks(s.end - s.begin);
        b = s.end;
        continue;
      }
      const std::size_t e = std::min(s.end, b + limit);
      chunks.push_back({b, e, first_block, s.block + cpu_adam::q8_blocks(e - s.begin)});
      b = e;
    }
  }
  return chunks;
}

RecordLayout record_layout(const ChunkSpan& c, const StateShape& shape) {
  const std::size_t n = c.end - c.begin, blocks = shape.q8 ? c.block_end - c.block_begin : 0;
  RecordLayout r{};
  r.m = round_up(n * shape.master_bytes, kPartAlign);
  r.v = r.m + round_up(n * shape.moment_bytes, kPartAlign);
  r.m_absmax = r.v + round_up(n * shape.moment_bytes, kPartAlign);
  r.v_absmax = r.m_absmax + round_up(blocks * 4, kPartAlign);
  r.bytes = round_up(r.v_absmax + blocks * 4, state_io::kAlignment);
  return r;
}

PagerBytes pager_bytes(const std::vector<ChunkSpan>& chunks, const StateShape& shape) {
  PagerBytes b;
  for (const ChunkSpan& c : chunks) {
    const std::size_t r = record_layout(c, shape).bytes;
    b.file += r;
    b.slot = std::max(b.slot, r);
  }
  return b;
}

StatePager::StatePager(std::vector<ChunkSpan> chunks, StateShape shape, Fresh fresh,
                       const Options& o)
    : chunks_(std::move(chunks)), shape_(shape), fresh_(std::move(fresh)) {
  if (chunks_.empty()) throw std::invalid_argument("StatePager: no chunks");
  if (o.slots < 2) throw std::invalid_argument("StatePager: needs at least 2 slots");
  std::uint64_t offset = 0;
  for (const ChunkSpan& c : chunks_) {
    records_.push_back({offset, record_layout(c, shape_)});
    offset += records_.back().at.bytes;
    slot_bytes_ = std::max(slot_bytes_, records_.back().at.bytes);
  }
  file_ = state_io::StateFile::create(o.dir, offset, o.file);
  queue_ = state_io::make_io_queue(o.queue, &queue_note_);
  slots_.resize(o.slots);
  for (Slot& s : slots_)
    s.buffer = pinned::HostBuffer(slot_bytes_);
  crc_.assign(chunks_.size(), {});
  written_.assign(chunks_.size(), false);
}

StatePager::~StatePager() {
  for (Slot& s : slots_) {
    if (s.state == SlotState::kReading || s.state == SlotState::kWriting) {
      try {
        queue_->wait(s.ticket);
      } catch (...) {  // the file is scratch: a failed write at teardown loses nothing kept
      }
    }
  }
  queue_.reset();  // drains whatever is still in flight before the slots' buffers go
}

std::string StatePager::describe() const {
  std::string d = "optimizer state on the drive: " + file_.name() + ", " +
                  std::to_string(chunks_.size()) + " chunks, " + std::to_string(slots_.size()) +
                  " staging slots, " + queue_->name();
  if (!queue_note_.empty()) d += " (" + queue_note_ + ")";
  if (!file_.note().empty()) d += "; " + file_.note();
  return d;
}

StatePager::View StatePager::view(std::size_t c, Slot& s) {
  const RecordLayout& r = records_[c].at;
  auto* base = static_cast<char*>(s.buffer.data());
  const ChunkSpan& k = chunks_[c];
  const bool q8 = shape_.q8;
  return {base,
          base + r.m,
          base + r.v,
          q8 ? reinterpret_cast<float*>(base + r.m_absmax) : nullptr,
          q8 ? reinterpret_cast<float*>(base + r.v_absmax) : nullptr,
          k.end - k.begin,
          q8 ? k.block_end - k.block_begin : 0};
}

StatePager::Slot* StatePager::slot_of(std::size_t c) {
  for (Slot& s : slots_) {
    if (s.state != SlotState::kFree && s.chunk == c) return &s;
  }
  return nullptr;
}

// The slot's state changes only once the queue took the request, so that a refused submit leaves
// no slot waiting on a ticket it never got.
void StatePager::submit(Slot& s, bool write) {
  const Record& r = records_[s.chunk];
  using Op = state_io::IoRequest::Op;
  const auto submitted = std::chrono::steady_clock::now();
  s.ticket = queue_->submit(
      {write ? Op::kWrite : Op::kRead, &file_, r.offset, s.buffer.data(), r.at.bytes});
  s.submitted = submitted;
  s.state = write ? SlotState::kWriting : SlotState::kReading;
}

void StatePager::wait(Slot& s, bool write) {
  const auto began = std::chrono::steady_clock::now();
  const auto completed = queue_->wait(s.ticket);
  if (!observer_) return;
  observer_({write, s.chunk, std::size_t(&s - slots_.data()), records_[s.chunk].at.bytes,
             s.submitted, completed, began, std::chrono::steady_clock::now()});
}

// Both consume the slot's ticket whatever the wait says: a slot is never waited for twice.
void StatePager::finish_write(Slot& s) {
  s.state = SlotState::kCached;  // the slot holds what the drive now holds
  wait(s, true);
}

void StatePager::finish_read(Slot& s) {
  s.state = SlotState::kFree;
  wait(s, false);
  const Record& r = records_[s.chunk];
  bytes_read_ += r.at.bytes;
  if (checksums(s) != crc_[s.chunk]) {
    const std::size_t c = s.chunk;
    throw state_io::IoError(file_.name() + ": chunk " + std::to_string(c) + " (bytes " +
                            std::to_string(r.offset) + " to " +
                            std::to_string(r.offset + r.at.bytes) +
                            ") changed on the drive since it was written (CRC-32C mismatch): "
                            "another program wrote there, or the drive returns wrong data; "
                            "resume from the last checkpoint, with a --state-dir nothing else "
                            "uses");
  }
  s.state = SlotState::kCached;
}

StatePager::Slot* StatePager::take_slot() {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kFree) return &s;
    if (s.state == SlotState::kCached && !s.dirty &&
        (best == nullptr || s.last_use < best->last_use)) {
      best = &s;
    }
  }
  if (best != nullptr) return best;
  for (Slot& s : slots_) {
    if (s.state == SlotState::kWriting) {  // oldest write first: submitted in use order
      if (best == nullptr || s.last_use < best->last_use) best = &s;
    }
  }
  if (best != nullptr) {
    finish_write(*best);
    return best;
  }
  for (Slot& s : slots_) {  // a prefetch nobody asked for yet gives way
    if (s.state == SlotState::kReading && (best == nullptr || s.last_use < best->last_use)) {
      best = &s;
    }
  }
  if (best != nullptr) finish_read(*best);
  return best;
}

std::vector<std::uint32_t> StatePager::checksums(const Slot& s) const {
  const std::size_t bytes = records_[s.chunk].at.bytes;
  std::vector<std::uint32_t> crc((bytes + kCrcPiece - 1) / kCrcPiece);
  const auto* data = static_cast<const std::byte*>(s.buffer.data());
  tbb::parallel_for(std::size_t{0}, crc.size(), [&](std::size_t i) {
    const std::size_t b = i * kCrcPiece;
    crc[i] = crc32c(std::span(data + b, std::min(kCrcPiece, bytes - b)));
  });
  return crc;
}

void StatePager::prefetch(std::size_t c) {
  if (c >= chunks_.size() || slot_of(c) != nullptr || !written_[c]) return;
  Slot* s = nullptr;
  for (Slot& f : slots_) {
    if (f.state == SlotState::kFree) s = &f;
  }
  for (Slot& f : slots_) {  // else the least recently used cached one, else the oldest write
    if (s == nullptr || s->state != SlotState::kFree) {
      if (f.state == SlotState::kCached && !f.dirty &&
          (s == nullptr || s->state != SlotState::kCached || f.last_use < s->last_use)) {
        s = &f;
      }
    }
  }
  if (s == nullptr) {
    for (Slot& f : slots_) {
      if (f.state == SlotState::kWriting && (s == nullptr || f.last_use < s->last_use)) s = &f;
    }
    if (s == nullptr) return;
    finish_write(*s);
  }
  s->chunk = c;
  s->state = SlotState::kFree;  // until the read is queued
  s->last_use = ++clock_;
  submit(*s, false);
}

void StatePager::write_behind(std::size_t keep) {
  for (Slot& s : slots_) {
    if (s.state != SlotState::kCached || !s.dirty || s.chunk == keep) continue;
    crc_[s.chunk] = checksums(s);
    submit(s, true);
    written_[s.chunk] = true;
    bytes_written_ += records_[s.chunk].at.bytes;
    s.dirty = false;
  }
}

StatePager::View StatePager::acquire(std::size_t c) {
  if (c >= chunks_.size()) throw std::out_of_range("StatePager::acquire: no such chunk");
  write_behind(c);
  Slot* s = slot_of(c);
  if (s != nullptr && s->state == SlotState::kHeld) {
    throw std::logic_error("StatePager::acquire: chunk already held");
  }
  if (s != nullptr && s->state == SlotState::kWriting) finish_write(*s);
  if (s != nullptr && s->state == SlotState::kReading) finish_read(*s);
  if (s == nullptr) {
    s = take_slot();
    if (s == nullptr) throw std::logic_error("StatePager::acquire: every slot is held");
    s->chunk = c;
    if (written_[c]) {
      s->state = SlotState::kFree;  // until the read is queued
      submit(*s, false);
      finish_read(*s);
    } else {
      std::fill_n(static_cast<char*>(s->buffer.data()), records_[c].at.bytes, 0);
      fresh_(chunks_[c], view(c, *s));
    }
  }
  s->state = SlotState::kHeld;
  s->last_use = ++clock_;
  return view(c, *s);
}

void StatePager::release(std::size_t c, bool dirty) {
  Slot* s = slot_of(c);
  if (s == nullptr || s->state != SlotState::kHeld) {
    throw std::logic_error("StatePager::release: chunk not held");
  }
  s->dirty = s->dirty || dirty || !written_[c];
  s->state = SlotState::kCached;
}

void StatePager::flush() {
  write_behind(chunks_.size());
  for (Slot& s : slots_) {
    if (s.state == SlotState::kWriting) finish_write(s);
  }
}

}  // namespace zo::optim
