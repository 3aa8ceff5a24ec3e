// The calibration audit (quant/calib_audit.h, `tachyon calib-audit`): planted overlaps are found
// (a whole file, a shared paragraph, one shared 13-gram, a shared source file named by the
// MANIFEST.tsv beside the text), disjoint text passes, and the committed tests/data/calib and
// tests/data/eval are disjoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "quant/calib_audit.h"
#include "test_util.h"

namespace tachyon {
namespace {

// `words` random lowercase words of 5-9 letters, `per_line` to a line, `per_paragraph` lines to a
// paragraph: with 26^5 or more spellings, two such texts share no 13-gram.
std::string random_text(std::mt19937& rng, int words, int per_line = 10, int per_paragraph = 4) {
  std::uniform_int_distribution<int> len(5, 9), letter(0, 25);
  std::string t;
  for (int i = 0; i < words; ++i) {
    for (int k = len(rng); k > 0; --k) t += static_cast<char>('a' + letter(rng));
    t += (i + 1) % (per_line * per_paragraph) == 0 ? "\n\n" : (i + 1) % per_line == 0 ? "\n" : " ";
  }
  return t;
}

AuditDocument doc(const std::string& name, const std::string& text) { return AuditDocument{name, text, {}}; }

TEST(CalibAudit, DisjointTextPasses) {
  std::mt19937 rng(testing::fresh_seed());
  const OverlapReport r = audit_overlap({doc("c", random_text(rng, 3000))}, {doc("e", random_text(rng, 3000))});
  EXPECT_TRUE(r.identical_documents.empty());
  EXPECT_TRUE(r.shared_sources.empty());
  EXPECT_EQ(r.shared_paragraphs, 0);
  EXPECT_EQ(r.shared_ngrams, 0);
  EXPECT_EQ(r.eval_paragraphs, 3000 / 40);
  EXPECT_EQ(r.eval_ngrams, 3000 - 12);
  EXPECT_FALSE(r.fails(AuditOptions{}));
}

TEST(CalibAudit, FindsAWholeFileEvenReflowed) {
  std::mt19937 rng(testing::fresh_seed());
  const std::string text = random_text(rng, 500);
  std::string reflowed = text;  // other line breaks and spaces: the same document
  for (char& c : reflowed) {
    if (c == '\n') c = ' ';
  }
  const OverlapReport r =
      audit_overlap({doc("calib.txt", random_text(rng, 400)), doc("copy.txt", reflowed)}, {doc("eval.txt", text)});
  ASSERT_EQ(r.identical_documents.size(), 1u);
  EXPECT_EQ(r.identical_documents[0], "copy.txt = eval.txt");
  EXPECT_TRUE(r.fails(AuditOptions{}));
}

TEST(CalibAudit, FindsASharedParagraph) {
  std::mt19937 rng(testing::fresh_seed());
  const std::string shared = "The quick brown fox jumps over the lazy dog while the cat sleeps.\n";
  const std::string calib = random_text(rng, 800) + shared + "\n" + random_text(rng, 800);
  const std::string eval = random_text(rng, 800) + "\n" + shared + "\n" + random_text(rng, 800);
  const OverlapReport r = audit_overlap({doc("c", calib)}, {doc("e", eval)});
  EXPECT_EQ(r.shared_paragraphs, 1);
  ASSERT_FALSE(r.examples.empty());
  EXPECT_NE(r.examples[0].find("quick brown fox"), std::string::npos) << r.examples[0];
  AuditOptions strict;
  strict.max_paragraph_overlap = 0.0;
  EXPECT_TRUE(r.fails(strict));
  // A paragraph of fewer than kMinParagraphWords words is not one (a brace, "return nil").
  const OverlapReport short_one = audit_overlap({doc("c", "return nil\n\n" + random_text(rng, 100))},
                                                {doc("e", random_text(rng, 100) + "\n\nreturn nil\n")});
  EXPECT_EQ(short_one.shared_paragraphs, 0);
}

TEST(CalibAudit, FindsOneShared13GramAndNoShorterRun) {
  std::mt19937 rng(testing::fresh_seed());
  const std::string gram = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike";  // 13 words
  const std::string twelve = "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee";
  const std::string calib = random_text(rng, 600) + " " + gram + " " + twelve + " " + random_text(rng, 600);
  // Other words around both, and the 12 words broken off from the 13: only the 13-gram is shared.
  const std::string eval = random_text(rng, 600) + " zulu " + gram + " zulu " + twelve + " zulu " + random_text(rng, 600);
  const OverlapReport r = audit_overlap({doc("c", calib)}, {doc("e", eval)});
  EXPECT_EQ(r.shared_ngrams, 1);
  ASSERT_FALSE(r.examples.empty());
  EXPECT_NE(r.examples.back().find("alpha bravo"), std::string::npos) << r.examples.back();
  AuditOptions strict;
  strict.max_ngram_overlap = 0.0;
  EXPECT_TRUE(r.fails(strict));
  EXPECT_FALSE(r.fails(AuditOptions{}));  // one n-gram in about 1,200 is under the default 1 %
  AuditOptions twelve_words;
  twelve_words.ngram = 12;
  EXPECT_EQ(audit_overlap({doc("c", calib)}, {doc("e", eval)}, twelve_words).shared_ngrams, 3);  // 2 of the 13, 1 of the 12
}

TEST(CalibAudit, FindsSharedSourceFilesThroughTheManifest) {
  std::mt19937 rng(testing::fresh_seed());
  const std::string dir = testing::scratch_dir("calib_audit");
  const auto write = [](const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
  };
  std::filesystem::create_directories(dir + "/calib");
  std::filesystem::create_directories(dir + "/eval");
  write(dir + "/calib/calib.txt", random_text(rng, 300));
  write(dir + "/eval/code.txt", random_text(rng, 300));
  const std::string header = "file\tbyte_offset\tbytes\tcategory\tpackage\tsource_path\tchunk\n";
  write(dir + "/calib/MANIFEST.tsv", header + "calib.txt\t0\t10\tcode-go\tgolang\tsrc/a.go\t2\n" +
                                         "calib.txt\t10\t10\tcode-go\tgolang\tsrc/b.go\t0\n");
  write(dir + "/eval/MANIFEST.tsv", header + "code.txt\t0\t10\tcode-go\tgolang\tsrc/b.go\t3\n" +
                                        "other.txt\t0\t10\tcode-go\tgolang\tsrc/a.go\t1\n");
  auto c = read_audit_document(dir + "/calib/calib.txt");
  auto e = read_audit_document(dir + "/eval/code.txt");
  ASSERT_TRUE(c.ok() && e.ok());
  EXPECT_EQ(c->sources, (std::vector<std::string>{"golang/src/a.go", "golang/src/b.go"}));
  EXPECT_EQ(e->sources, (std::vector<std::string>{"golang/src/b.go"}));  // other.txt's rows are not code.txt's
  const OverlapReport r = audit_overlap({*c}, {*e});
  EXPECT_EQ(r.shared_sources, (std::vector<std::string>{"golang/src/b.go"}));
  EXPECT_EQ(r.shared_ngrams, 0);
  EXPECT_TRUE(r.fails(AuditOptions{}));
  EXPECT_FALSE(read_audit_document(dir + "/missing.txt").ok());

  // The command: exit 1 and the shared source named; 0 on disjoint files.
  auto bad = testing::run_command(testing::tachyon_binary() + " calib-audit --calib " + dir + "/calib/calib.txt --eval " +
                                  dir + "/eval/code.txt --json " + dir + "/a.json");
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.out.find("shared source: golang/src/b.go"), std::string::npos) << bad.out;
  std::filesystem::remove(dir + "/eval/MANIFEST.tsv");
  auto good = testing::run_command(testing::tachyon_binary() + " calib-audit --calib " + dir + "/calib/calib.txt --eval " +
                                   dir + "/eval/code.txt");
  EXPECT_EQ(good.exit_code, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("disjoint"), std::string::npos) << good.out;
}

// The committed calibration and evaluation sets share no source file, and little text.
TEST(CalibAudit, TheCommittedSetsAreDisjoint) {
  const std::string data = testing::source_dir() + "/tests/data/";
  auto c = read_audit_document(data + "calib/calib.txt");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<AuditDocument> eval;
  for (const char* f : {"eval/code.txt", "eval/prose.txt"}) {
    auto e = read_audit_document(data + f);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_FALSE(e->sources.empty());
    eval.push_back(std::move(e).value());
  }
  EXPECT_GT(c->sources.size(), 20u);
  const OverlapReport r = audit_overlap({*c}, eval);
  std::printf("tests/data calib vs eval: %s\n", r.summary(AuditOptions{}).c_str());
  for (const std::string& ex : r.examples) std::printf("  e.g. %s\n", ex.c_str());
  EXPECT_TRUE(r.shared_sources.empty());
  EXPECT_FALSE(r.fails(AuditOptions{}));
}

}  // namespace
}  // namespace tachyon
