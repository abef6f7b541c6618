'use strict';
// The fenced code blocks of every Markdown file in the repository, with where they start, for
// the tests that run them (test/examples.test.js here; clients/python/tests/test_readme.py does
// the same for Python). A block is not run when the nearest non-blank line before its opening
// fence is an HTML comment `<!-- not run: why -->` (a synopsis, an output sample, a program that
// needs a cluster...): the reason shows to a reader of the source and to the test.

const fs = require('node:fs');
const path = require('node:path');

const REPO = path.resolve(__dirname, '..', '..', '..');
const SKIP_DIRS = new Set(['.git', 'node_modules', 'target', '.mirror']);

/** Every `*.md` under the repository, as paths relative to it, sorted. */
function markdownFiles(dir = REPO) {
  const out = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (entry.name.startsWith('.') || SKIP_DIRS.has(entry.name)) continue;
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...markdownFiles(full));
    else if (entry.name.endsWith('.md')) out.push(path.relative(REPO, full));
  }
  return out.sort();
}

/**
 * The fenced blocks of `file` (relative to the repository): {file, line (of the opening fence),
 * lang (the info string's first word, lower case, '' if none), code, skip (the reason of a
 * `<!-- not run: ... -->` comment, or null)}.
 */
function blocks(file) {
  const lines = fs.readFileSync(path.join(REPO, file), 'utf8').split('\n');
  const out = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})\s*([^\s`]*)/.exec(lines[i]);
    if (!open) continue;
    const fence = open[2];
    let j = i + 1;
    while (j < lines.length && !lines[j].trimStart().startsWith(fence)) j++;
    let k = i - 1;
    while (k >= 0 && lines[k].trim() === '') k--;
    const note = k >= 0 ? /^<!--\s*not run:\s*(.*?)\s*-->$/.exec(lines[k].trim()) : null;
    out.push({
      file,
      line: i + 1,
      lang: open[3].split(',')[0].toLowerCase(),
      code: lines.slice(i + 1, j).join('\n') + '\n',
      skip: note ? note[1] : null,
    });
    i = j;
  }
  return out;
}

module.exports = { REPO, markdownFiles, blocks };
