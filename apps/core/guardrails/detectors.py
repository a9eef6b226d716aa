"""The built-in detectors: US Social Security numbers, US phone numbers, email addresses and dates of
birth. What each matches and does not is in docs/guardrails.md; the table of positives and near misses
is tests/unit/test_guardrails_detectors.py.

- `ssn`: NNN-NN-NNNN anywhere; NNNNNNNNN and NNN NN NNNN only right after an SSN keyword ("SSN",
  "social security number", ...), since nine digits alone are as often an account or claim number. The
  SSA's never-issued ranges are no SSN: area 000, 666 and 900-999, group 00, serial 0000.
- `phone`: NANP numbers with an area code written as one: (NNN) NNN-NNNN, NNN-NNN-NNNN, NNN.NNN.NNNN,
  NNN NNN NNNN, with +1 or 1 before, and +1NNNNNNNNNN (E.164). Ten bare digits are not matched: a
  provider's NPI is ten digits. Validity (area code and exchange in service) is `phonenumbers`'s, the
  port of Google's libphonenumber, whose metadata follows new area codes; its own matcher is not used:
  it looks at the text around a number, which would make a match depend on where a stream's chunks end.
- `email`: local@domain.tld within RFC 5321's 64-character local part; not when followed by `(`, `[`
  or `.x` (code: `a@b.shape()`), nor with a file extension as its TLD (`icon@2x.png`).
- `dob`: a date (M/D/Y, Y-M-D, "March 3, 1980", "3rd of March 1980") right after a birth keyword
  ("DOB", "date of birth", "birthdate", "born (on)"), within a few characters; a real calendar date.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

import phonenumbers

from apps.core.guardrails.rules import Rule, python_rule

_NOT_AFTER_NUMBER = r"(?![A-Za-z0-9\-]|\.[0-9])"  # no digit, letter or hyphen run goes on


@dataclass(frozen=True)
class Detector:
    name: str
    rules: tuple[Rule, ...]

    @property
    def label(self) -> str:
        """What replaces a match: `[REDACTED:<LABEL>]`."""
        return self.name.upper()


def _digits(value: str) -> str:
    return "".join(c for c in value if c.isdigit())


def valid_ssn(value: str) -> bool:
    digits = _digits(value)
    if len(digits) != 9:
        return False
    area, group, serial = int(digits[:3]), digits[3:5], digits[5:]
    return area not in (0, 666) and area < 900 and group != "00" and serial != "0000"


def valid_phone(value: str) -> bool:
    digits = _digits(value)[-10:]
    try:
        number = phonenumbers.parse("+1" + digits, None)
    except phonenumbers.NumberParseException:
        return False
    return number.country_code == 1 and phonenumbers.is_valid_number(number)


# Extensions seen in code after an `@` (retina assets, imports): not TLDs a member writes to.
FILE_EXTENSIONS = frozenset((
    "png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "css", "js", "mjs", "ts", "tsx", "jsx", "json",
    "yaml", "yml", "toml", "xml", "html", "htm", "txt", "csv", "log", "lock", "py", "rb", "java", "kt", "swift",
    "cpp", "hpp",
))  # fmt: skip


def valid_email(value: str) -> bool:
    local, _, domain = value.rpartition("@")
    labels = domain.split(".")
    return (
        ".." not in value
        and not local.endswith(".")
        and all(label and label[0] != "-" and label[-1] != "-" for label in labels)
        and labels[-1].lower() not in FILE_EXTENSIONS
    )


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")


def date_of(value: str) -> date | None:
    """The calendar date a matched date of birth names (None: no such day). A two-digit year is read
    in the 2000s, which only matters for February 29 (2000 was a leap year)."""
    words = re.findall(r"[A-Za-z]+|[0-9]+", value)
    month_word = next((w for w in words if w[:3].lower() in _MONTHS), None)
    numbers = [w for w in words if w.isdigit()]
    if month_word is not None:
        month, (day, year) = _MONTHS.index(month_word[:3].lower()) + 1, (numbers[0], numbers[-1])
    elif len(numbers[0]) == 4:
        year, month, day = numbers[0], int(numbers[1]), numbers[2]
    else:
        month, day, year = int(numbers[0]), numbers[1], numbers[2]
    full_year = int(year) + (2000 if len(year) == 2 else 0)
    if not 1850 <= full_year <= 2099:
        return None
    try:
        return date(full_year, month, int(day))
    except ValueError:
        return None


def valid_dob(value: str) -> bool:
    return date_of(value) is not None


SSN_DASHED = rf"(?<![A-Za-z0-9.\-])(?P<v>[0-9]{{3}}-[0-9]{{2}}-[0-9]{{4}}){_NOT_AFTER_NUMBER}"
SSN_KEYWORD = (
    r"(?i:\b(?:ssn|ss#|social security(?: number| no\.?| #)?|soc\.? sec\.?(?: no\.?)?))"
    r"[ \t]{0,3}(?:[:#=\-]{1,2}[ \t]{0,3}|(?:is|was|of)[ \t]{1,3})?"
    rf"(?P<v>[0-9]{{9}}|[0-9]{{3}} [0-9]{{2}} [0-9]{{4}}|[0-9]{{3}}-[0-9]{{2}}-[0-9]{{4}}){_NOT_AFTER_NUMBER}"
)
PHONE = (
    r"(?<![A-Za-z0-9+\-.])(?P<v>(?:\+?1[ .\-]?)?(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}[ .\-])"
    rf"[2-9][0-9]{{2}}[ .\-][0-9]{{4}}|\+1[2-9][0-9]{{2}}[2-9][0-9]{{6}}){_NOT_AFTER_NUMBER}"
)
EMAIL = (
    r"(?<![A-Za-z0-9._%+\-])(?P<v>[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}"
    r"@[A-Za-z0-9](?:[A-Za-z0-9.\-]{0,48}[A-Za-z0-9])?\.[A-Za-z]{2,10})"
    r"(?![A-Za-z0-9\-(\[]|\.[A-Za-z0-9])"
)
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_M, _D = r"(?:0?[1-9]|1[0-2])", r"(?:0?[1-9]|[12][0-9]|3[01])"
_DATE = "|".join(
    [
        *(rf"{_M}{sep}{_D}{sep}(?:[0-9]{{4}}|[0-9]{{2}})" for sep in ("/", "-", r"\.")),
        *(rf"[0-9]{{4}}{sep}{_M}{sep}{_D}" for sep in ("-", "/")),
        rf"{_MONTH}[ \t]{{1,3}}{_D}(?:st|nd|rd|th)?,?[ \t]{{1,3}}[0-9]{{4}}",
        rf"{_D}(?:st|nd|rd|th)?[ \t]{{1,3}}(?:of[ \t]{{1,3}})?{_MONTH},?[ \t]{{1,3}}[0-9]{{4}}",
    ]
)
DOB = (
    r"(?i)\b(?:d\.?o\.?b\.?|date[ \t]{1,3}of[ \t]{1,3}birth|birth[ \t]?date|birthday|born(?:[ \t]{1,3}on)?)"
    r"[ \t]{0,3}(?:[:#=\-]{1,2}[ \t]{0,3}|(?:is|was|of)[ \t]{1,3})?"
    rf"(?P<v>{_DATE})(?![0-9])"
)

BUILTIN: dict[str, Detector] = {
    "ssn": Detector("ssn", (python_rule(SSN_DASHED, valid_ssn), python_rule(SSN_KEYWORD, valid_ssn))),
    "phone": Detector("phone", (python_rule(PHONE, valid_phone),)),
    "email": Detector("email", (python_rule(EMAIL, valid_email),)),
    "dob": Detector("dob", (python_rule(DOB, valid_dob),)),
}
