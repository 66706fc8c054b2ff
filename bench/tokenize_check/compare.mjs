// Compares offload_train's token shards with an independent tokenizer, document by document.
// Usage: node compare.mjs KIND TOKENIZER_JSON CORPUS.jsonl SHARD.bin
//   KIND: tiktoken-gpt2 (js-tiktoken's GPT-2 ranks) or hf (Hugging Face's tokenizers.js, which
//   runs the tokenizer.json itself, add_special_tokens false).
// Exits 1 at the first difference, printing the document and both id lists around it.
import fs from "fs";

const [kind, tokenizerJson, corpus, shard] = process.argv.slice(2);
// Both references run the pattern as a JavaScript RegExp, whose \s holds U+FEFF and lacks U+0085,
// unlike Unicode White_Space, which tiktoken (Rust regex) and HF's Rust tokenizers (Oniguruma)
// use: documents with either are left out (tests/test_tokenize.cpp pins offload_train there).
const skip = (s) => s.includes("\ufeff") || s.includes("\u0085");
let encode;
if (kind === "tiktoken-gpt2") {
  const { getEncoding } = await import("js-tiktoken");
  const enc = getEncoding("gpt2");
  encode = (s) => enc.encode(s, [], []);  // special-token strings as text
} else {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const t = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerJson)), {});
  encode = (s) => t.encode(s, { add_special_tokens: false }).ids;
}
const buf = fs.readFileSync(shard);
const header = new Int32Array(buf.buffer, buf.byteOffset, 256);
const count = header[2];
const ids = header[0] === 20240520 ? new Uint16Array(buf.buffer, buf.byteOffset + 1024, count)
                                   : new Uint32Array(buf.buffer, buf.byteOffset + 1024, count);
const docs = fs.readFileSync(corpus, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
// The shard's documents: each starts with the document token, which text never produces.
const doc_token = ids[0];
const starts = [];
for (let i = 0; i < count; ++i) if (ids[i] === doc_token) starts.push(i);
starts.push(count);
if (starts.length - 1 !== docs.length) {
  console.log(`the shard holds ${starts.length - 1} documents, the corpus ${docs.length}`);
  process.exit(1);
}
let total = 0, skipped = 0;
for (let d = 0; d < docs.length; ++d) {
  if (skip(docs[d])) {
    ++skipped;
    continue;
  }
  const want = encode(docs[d]);
  const got = ids.slice(starts[d] + 1, starts[d + 1]);
  const i = want.findIndex((v, k) => v !== got[k]);
  if (i >= 0 || got.length !== want.length) {
    console.log(`document ${d} differs at token ${i >= 0 ? i : Math.min(got.length, want.length)}:`);
    console.log(JSON.stringify(docs[d].slice(0, 400)));
    console.log("offload_train:", Array.from(got).join(","));
    console.log("reference:    ", want.join(","));
    process.exit(1);
  }
  total += want.length;
}
console.log(`${kind}: ${docs.length - skipped} documents, ${total} tokens, all ids equal` +
            (skipped ? ` (${skipped} documents with U+FEFF or U+0085 left out)` : ""));
