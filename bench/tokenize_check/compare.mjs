// Compares offload_train's token shards with an independent tokenizer, document by document.
// Usage: node compare.mjs KIND TOKENIZER_JSON CORPUS.jsonl SHARD.bin
//   KIND: tiktoken-gpt2 (js-tiktoken's GPT-2 ranks) or hf (Hugging Face's tokenizers.js, which
//   runs the tokenizer.json itself, add_special_tokens false).
// Exits 1 at the first difference, printing the document and both id lists around it.
import fs from "fs";

const [kind, tokenizerJson, corpus, shard] = process.argv.slice(2);
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
let at = 0, total = 0;
for (let d = 0; d < docs.length; ++d) {
  const want = encode(docs[d]);
  const doc_token = ids[at++];
  for (let i = 0; i < want.length; ++i, ++at) {
    if (ids[at] !== want[i]) {
      console.log(`document ${d} differs at token ${i} (doc token ${doc_token}):`);
      console.log(JSON.stringify(docs[d].slice(0, 400)));
      console.log("offload_train:", Array.from(ids.slice(at - i, at - i + want.length + 5)).join(","));
      console.log("reference:    ", want.join(","));
      process.exit(1);
    }
  }
  total += want.length;
}
if (at !== count) {
  console.log(`offload_train wrote ${count - at} tokens more than the reference`);
  process.exit(1);
}
console.log(`${kind}: ${docs.length} documents, ${total} tokens, all ids equal`);
