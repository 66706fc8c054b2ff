// The rows one pass of a model's forward runs over, so that a training or prompt forward and a
// decode step with the KV cache (model.h, Model::decode) share the block code: the whole batch
// (B sequences of T positions from row 0), or one decode step (one row of the one sequence, at
// position pos). Every activation buffer keeps its (B, T_max) row layout; a pass reads and
// writes its rows starting at row0.
#pragma once

namespace zo::model {

struct RowSpan {
  int row0;      // first row of the activations this pass reads and writes
  int B, T;      // the row-wise ops' batch and sequence: (B, t) or (1, 1)
  int pos = -1;  // the decode step's position; -1: a whole forward

  static RowSpan whole(int B, int t) { return {0, B, t}; }
  static RowSpan step(int pos) { return {pos, 1, 1, pos}; }
  bool decode() const { return pos >= 0; }
  int rows() const { return B * T; }
};

}  // namespace zo::model
