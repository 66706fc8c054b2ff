// Writes a varied .jsonl corpus for the tokenizer comparison (compare.mjs): English prose and
// code found on this machine, UTF-8 test texts in several scripts, and seeded random documents
// built to hit the pre-tokenizer's corner cases. Usage: node make_corpus.mjs OUT.jsonl MAX_MB
import fs from "fs";
import path from "path";

const [out, maxMb = "8"] = process.argv.slice(2);
const budget = Number(maxMb) * 1e6;
const docs = [];
let bytes = 0;
const add = (text) => {
  // Special-token strings would be split out by the references; offload_train keeps them as text
  // (a test covers that), so they are left out of the comparison.
  text = text.replaceAll("<|", "< |");
  if (bytes + text.length > budget) return false;
  docs.push(text);
  bytes += Buffer.byteLength(text);
  return true;
};
const files = (dir, re, limit) => {
  const found = [];
  const walk = (d) => {
    let entries = [];
    try { entries = fs.readdirSync(d, { withFileTypes: true }); } catch { return; }
    for (const e of entries.sort((a, b) => (a.name < b.name ? -1 : 1))) {
      if (found.length >= limit) return;
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (re.test(e.name)) found.push(p);
    }
  };
  walk(dir);
  return found;
};
const utf8 = (p) => {
  const b = fs.readFileSync(p);
  const s = b.toString("utf8");
  return Buffer.from(s, "utf8").equals(b) ? s : null;  // skip files that are not UTF-8
};

// A seeded generator (mulberry32) so that the corpus is the same on every machine.
let seed = 1234567;
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];
const pieces = [
  // No U+0085 or U+FEFF: the JavaScript references disagree with tiktoken and HF there
  // (compare.mjs); tests/test_tokenize.cpp covers them.
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u180e",
  "\u2028", "\u3000", "\u200b", "\u1680", "\u2009", "'s", "'S", "'ll", "'LL", "'re", "'ve", "'m",
  "'d", "'t", "'x", "\u017fs", "don't", "I'M", "1", "12", "123", "1234", "12345", "3.14",
  "1,000,000", "\u0661\u0662\u0663", "\u2167", "\u00bd", "hello", "World", "\u00e9t\u00e9",
  "e\u0301te\u0301", "na\u00efve", "\u0391\u03b8\u03ae\u03bd\u03b1", "\u041c\u043e\u0441\u043a\u0432\u0430",
  "\u4e2d\u6587\u6d4b\u8bd5", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4",
  "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e2\u05d1\u05e8\u05d9\u05ea",
  "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "\ud83d\ude00",
  "\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", "\ud83c\uddfa\ud83c\uddf8", "\u2764\ufe0f",
  "!", "?!", "...", "---", "(", ")", "[x]", "{}", "$", "%", "&&", "||", "=>", "#", "@user",
  "http://example.com/a?b=c", "a_b", "__init__", "camelCase", "C++", "\\n", "\"", "\u201cq\u201d",
  "\u00ab\u00bb", "\u2014", "\u2026", "\u00a9", "\u0000", "\u0007", "\u007f", "\u00ad",
  "\u{1d400}\u{1d401}", "\u{20000}", "\u{10ffff}", "<tool_call>", "</tool_call>",
];
const random_doc = () => {
  let s = "";
  const n = 1 + Math.floor(rand() * 60);
  for (let i = 0; i < n; ++i) s += pick(pieces);
  return s;
};

for (const p of files("/usr/share/vim", /\.txt$/, 400)) {
  const s = utf8(p);
  if (!s) continue;
  for (const para of s.split(/\n\s*\n/)) if (!add(para)) break;
  if (bytes > budget * 0.45) break;
}
const py = fs.readdirSync("/usr/lib").filter((d) => /^python3\.\d+$/.test(d)).sort()[0];
for (const p of files(`/usr/lib/${py ?? "python3"}`, /\.py$/, 4000)) {
  const s = utf8(p);
  if (s && !add(s)) break;
  if (bytes > budget * 0.7) break;
}
for (const p of files(`/usr/lib/${py ?? "python3"}/test`, /(utf-?8|\.txt$)/i, 200)) {
  const s = utf8(p);
  if (s) add(s);
}
while (bytes < budget * 0.99 && add(random_doc())) {}
fs.writeFileSync(out, docs.map((text) => JSON.stringify({ text })).join("\n") + "\n");
console.log(`${out}: ${docs.length} documents, ${(bytes / 1e6).toFixed(1)} MB`);
