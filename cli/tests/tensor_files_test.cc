// The .npy and .safetensors readers and writers (validation/npy.h,
// validation/safetensors.h): exact round trips for every dtype, and every
// malformed input rejected with qknorm::Error naming the file and the problem:
// wrong dtype, bad shape, truncated data, bad header, a header claiming more
// data than the file holds. Every prefix of a valid file is also rejected
// (no reader may read past its buffer; ASan builds check that too).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "qknorm/error.h"
#include "validation/npy.h"
#include "validation/safetensors.h"

namespace qknorm::validation {
namespace {

HostTensor tensor(const std::string& name, Precision p,
                  std::vector<int64_t> shape) {
  // Values exactly representable in every format.
  return validation::make_host_tensor(
      name, p, std::move(shape), [&](int64_t i) {
        return round_to(
            p, std::ldexp(static_cast<double>(i % 13) - 6.25, -(i % 5)));
      });
}

// Runs `f`, expecting qknorm::Error whose file is `source` and whose rule
// contains `needle`.
template <class F>
void expect_error(F f, const std::string& source, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.tensor(), source) << e.what();
    EXPECT_NE(e.rule().find(needle), std::string::npos) << "rule: " << e.rule();
  }
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

std::string npy_with_header(const std::string& dict, size_t data_bytes) {
  std::string h = dict;
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  return out + h + std::string(data_bytes, '\0');
}

std::string safetensors_with_header(const std::string& json,
                                    size_t data_bytes) {
  return le64(json.size()) + json + std::string(data_bytes, '\0');
}

TEST(Npy, RoundTripsEveryNpyDtypeExactly) {
  for (Precision p : {Precision::kF64, Precision::kF32, Precision::kF16}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{2, 3, 4, 5}, std::vector<int64_t>{7},
          std::vector<int64_t>{}}) {
      const HostTensor t = tensor("x", p, shape);
      const HostTensor r = parse_npy(write_npy(t), "x.npy");
      EXPECT_EQ(r.dtype, p);
      EXPECT_EQ(r.shape, t.shape);
      EXPECT_EQ(r.values, t.values);
    }
  }
}

TEST(Npy, ReadsBigEndianAndVersion2) {
  // '>f4' holding 1.5 and -2: bytes 3f c0 00 00, c0 00 00 00.
  std::string f = npy_with_header(
      "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 0);
  f += std::string("\x3f\xc0\x00\x00\xc0\x00\x00\x00", 8);
  const HostTensor t = parse_npy(f, "be.npy");
  EXPECT_EQ(t.values, (std::vector<double>{1.5, -2.0}));
  // Version 2.0: 4-byte header length.
  std::string h = "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }";
  h.append((64 - (12 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  std::string v2 = std::string("\x93NUMPY\x02\x00", 8) +
                   static_cast<char>(h.size()) + std::string(3, '\0') + h;
  const double x = 0.1;
  v2.append(reinterpret_cast<const char*>(&x), 8);
  EXPECT_EQ(parse_npy(v2, "v2.npy").values, std::vector<double>{0.1});
}

TEST(Npy, RejectsWrongDtype) {
  expect_error(
      [] {
        parse_npy(
            npy_with_header(
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8),
            "i.npy");
      },
      "i.npy", "unsupported dtype '<i4'");
  expect_error(
      [] {
        parse_npy(npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': "
                                  "False, 'shape': (2,), }",
                                  8),
                  "s.npy");
      },
      "s.npy", "structured");
  expect_error([] { write_npy(tensor("b", Precision::kBF16, {2})); }, "b",
               "bfloat16");
}

TEST(Npy, RejectsBadHeaders) {
  expect_error([] { parse_npy("PK\x03\x04 this is a zip", "z.npy"); }, "z.npy",
               "magic");
  expect_error(
      [] { parse_npy(std::string("\x93NUMPY\x09\x00\x10\x00", 10), "v.npy"); },
      "v.npy", "version 9");
  expect_error(
      [] { parse_npy(npy_with_header("['descr', '<f4']", 0), "l.npy"); },
      "l.npy", "bad header");
  expect_error(
      [] {
        parse_npy(npy_with_header("{'descr': '<f4', 'shape': (2,), }", 8),
                  "m.npy");
      },
      "m.npy", "missing");
  expect_error(
      [] {
        parse_npy(
            npy_with_header(
                "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", 8),
            "b.npy");
      },
      "b.npy", "True or False");
  expect_error(
      [] {
        parse_npy(
            npy_with_header(
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2,2), }",
                16),
            "f.npy");
      },
      "f.npy", "fortran_order");
  expect_error(
      [] {
        parse_npy(
            npy_with_header(
                "{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", 8),
            "q.npy");
      },
      "q.npy", "bad header");
}

TEST(Npy, RejectsBadShapes) {
  expect_error(
      [] {
        parse_npy(
            npy_with_header(
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,-3), }",
                8),
            "n.npy");
      },
      "n.npy", "shape");
  expect_error(
      [] {
        parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (99999999999,99999999999), }",
                                  8),
                  "o.npy");
      },
      "o.npy", "overflows");
  expect_error(
      [] {
        parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (99999999999999999999,), }",
                                  8),
                  "h.npy");
      },
      "h.npy", "too large");
}

TEST(Npy, RejectsTruncatedDataAndHeaderClaimingMore) {
  const std::string good = write_npy(tensor("x", Precision::kF32, {3, 4}));
  expect_error([&] { parse_npy(good.substr(0, good.size() - 1), "t.npy"); },
               "t.npy", "truncated data");
  expect_error([&] { parse_npy(good + "junk", "j.npy"); }, "j.npy",
               "after the data");
  // Header length field larger than the file.
  std::string claim = good.substr(0, 10);
  claim[8] = '\xff';
  claim[9] = '\xff';
  expect_error([&] { parse_npy(claim, "c.npy"); }, "c.npy",
               "header claims 65535 bytes");
}

TEST(Npy, EveryPrefixOfAValidFileIsRejected) {
  const std::string good = write_npy(tensor("x", Precision::kF16, {2, 3}));
  for (size_t n = 0; n < good.size(); ++n) {
    // A heap copy of exactly n bytes, so ASan catches any over-read.
    std::vector<char> buf(good.begin(),
                          good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_npy(std::string_view(buf.data(), n), "p.npy"), Error)
        << n;
  }
}

TEST(NpyFile, NamesTheFileAndItsStem) {
  expect_error([] { read_npy_file("/nonexistent/dir/q.npy"); },
               "/nonexistent/dir/q.npy", "cannot open");
}

TEST(Safetensors, RoundTripsEveryDtypeExactly) {
  std::vector<HostTensor> ts = {tensor("q", Precision::kBF16, {2, 1, 3, 4}),
                                tensor("k", Precision::kF16, {5}),
                                tensor("v", Precision::kF32, {2, 2}),
                                tensor("g", Precision::kF64, {})};
  const std::vector<HostTensor> r =
      parse_safetensors(write_safetensors(ts), "a.safetensors");
  ASSERT_EQ(r.size(), ts.size());
  for (const HostTensor& t : ts) {
    const auto it = std::find_if(r.begin(), r.end(), [&](const HostTensor& x) {
      return x.name == t.name;
    });
    ASSERT_NE(it, r.end()) << t.name;
    EXPECT_EQ(it->dtype, t.dtype);
    EXPECT_EQ(it->shape, t.shape);
    EXPECT_EQ(it->values, t.values);
  }
}

TEST(Safetensors, RejectsWrongDtype) {
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8),
            "i.st");
      },
      "i.st", "unsupported dtype 'I32'");
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8),
            "n.st");
      },
      "n.st", "dtype");
}

TEST(Safetensors, RejectsBadHeaders) {
  expect_error([] { parse_safetensors("abc", "s.st"); }, "s.st",
               "8-byte header size");
  expect_error(
      [] {
        parse_safetensors(safetensors_with_header("{not json", 0), "j.st");
      },
      "j.st", "not valid JSON");
  expect_error(
      [] { parse_safetensors(safetensors_with_header("[1,2]", 0), "a.st"); },
      "a.st", "not a JSON object");
  expect_error(
      [] {
        parse_safetensors(safetensors_with_header(R"({"q":3})", 0), "o.st");
      },
      "o.st", "not an object");
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"F32","data_offsets":[0,8]}})", 8),
            "m.st");
      },
      "m.st", "shape");
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
            "r.st");
      },
      "r.st", "begin > end");
  expect_error(
      [] {
        parse_safetensors(safetensors_with_header(R"({"__metadata__":[1]})", 0),
                          "md.st");
      },
      "md.st", "__metadata__");
  expect_error(
      [] { parse_safetensors(le64(uint64_t{1} << 40) + "{}", "big.st"); },
      "big.st", "header claims");
}

TEST(Safetensors, RejectsBadShapes) {
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,8]}})",
                8),
            "n.st");
      },
      "n.st", "non-negative");
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
            "w.st");
      },
      "w.st", "needs 12 bytes");
  expect_error(
      [] {
        parse_safetensors(
            safetensors_with_header(
                R"({"q":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                8),
            "o.st");
      },
      "o.st", "overflows");
}

TEST(Safetensors, RejectsTruncatedDataAndHeaderClaimingMore) {
  const std::string good =
      write_safetensors({tensor("q", Precision::kF32, {4, 4})});
  expect_error(
      [&] { parse_safetensors(good.substr(0, good.size() - 4), "t.st"); },
      "t.st", "past the data block");
  // The size field claims more header than the file holds.
  std::string claim = good;
  claim[0] = static_cast<char>(static_cast<unsigned char>(claim[0]) + 100);
  expect_error([&] { parse_safetensors(claim, "c.st"); }, "c.st",
               "header claims");
}

TEST(Safetensors, EveryPrefixOfAValidFileIsRejected) {
  const std::string good =
      write_safetensors({tensor("q", Precision::kBF16, {2, 3}),
                         tensor("g", Precision::kF64, {})});
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<char> buf(good.begin(),
                          good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_safetensors(std::string_view(buf.data(), n), "p.st"),
                 Error)
        << n;
  }
}

TEST(Safetensors, WriterRefusesDuplicateNames) {
  EXPECT_THROW(write_safetensors({tensor("q", Precision::kF32, {1}),
                                  tensor("q", Precision::kF32, {1})}),
               Error);
}

}  // namespace
}  // namespace qknorm::validation
