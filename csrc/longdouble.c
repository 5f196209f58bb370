/* INCRBYFLOAT and HINCRBYFLOAT arithmetic in the platform's long double (x86-64: 80-bit
 * extended precision; aarch64: 128-bit quad), which is what Redis computes in, so results
 * and their text match Redis's on the same platform. Called from src/semantics/float.rs. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest text a value may have, as Redis's MAX_LONG_DOUBLE_CHARS. */
#define MK_LD_MAX 5120

/* Parses s[0..len) as strtold does; 1 and *out on success, 0 when it is not a float: empty,
 * too long, leading space, trailing bytes, NaN, or out of range (overflow or underflow to 0). */
static int mk_ld_parse(const char *s, size_t len, long double *out) {
    char buf[MK_LD_MAX];
    char *end;
    long double v;
    if (len == 0 || len >= sizeof buf) return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    v = strtold(buf, &end);
    /* end short of len: bytes after the number, a NUL byte among them ("1\0002" is no float). */
    if (isspace((unsigned char)buf[0]) || end != buf + len || errno == EINVAL || isnan(v)) return 0;
    if (errno == ERANGE && (isinf(v) || fpclassify(v) == FP_ZERO)) return 0;
    *out = v;
    return 1;
}

/* 1 when s[0..len) is a float (see mk_ld_parse), 2 when it is one but not finite, else 0. */
int mk_ld_check(const char *s, size_t len) {
    long double v;
    if (!mk_ld_parse(s, len, &v)) return 0;
    return isfinite(v) ? 1 : 2;
}

/* a + b, written to out as "%.17Lf" with trailing zeros (and a bare '.') removed and "-0"
 * written "0". Returns the text's length, or -1 when a is not a float, -2 when b is not,
 * -3 when the sum is NaN or infinite, -4 when the text would not fit in MK_LD_MAX bytes. */
long mk_ld_add(const char *a, size_t alen, const char *b, size_t blen, char *out, size_t outlen) {
    long double x, y, sum;
    int n;
    if (!mk_ld_parse(a, alen, &x)) return -1;
    if (!mk_ld_parse(b, blen, &y)) return -2;
    sum = x + y;
    if (!isfinite(sum)) return -3;
    n = snprintf(out, outlen, "%.17Lf", sum);
    if (n < 0 || (size_t)n >= outlen) return -4;
    if (memchr(out, '.', (size_t)n) != NULL) {
        while (n > 0 && out[n - 1] == '0') n--;
        if (n > 0 && out[n - 1] == '.') n--;
    }
    if (n == 2 && out[0] == '-' && out[1] == '0') {
        out[0] = '0';
        n = 1;
    }
    return n;
}
