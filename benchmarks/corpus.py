"""Deterministic calibration corpus for the token estimator.

Everything is built from what any machine with this Python has - no downloads:

- ``prose``: English paragraphs from the interpreter's own help topics
  (``pydoc_data.topics``) and standard-library docstrings, code-looking lines dropped.
- ``code``: slices of standard-library ``.py`` sources, unified diffs between a slice and
  a lightly edited copy, log/traceback-style tool output, and file reads with every line
  behind its number (``cat -n``'s tab or Claude Code's ``     1→``).
- ``json``: generated tool outputs (file listings, search hits, API records, test reports)
  serialised compact or indented, as tools return them, and tool-call arguments (file
  contents and edits inside JSON strings, newlines and quotes escaped).
- ``cjk``: Chinese and Japanese prose assembled from the natural sentences embedded below,
  with inline code words and full-width punctuation, as agent conversations have them.
- ``other_scripts``: Russian, Ukrainian, Arabic, Hebrew, Greek, Hindi, Thai, Korean,
  Vietnamese and accented Latin (French/German/Spanish), with and without emoji.
- ``mixed_turns``: whole provider-facing message dicts - user/assistant/tool messages in
  OpenAI, Anthropic and Amplifier shapes, with 1-3 tool calls per assistant turn and tool
  results of 200 B - 8 KB drawn from the classes above.

Text samples are 200 B - 8 KB (log-uniform), like the tool results in the benchmark
histories. The same ``seed`` always gives the same corpus on the same Python version.
"""

from __future__ import annotations

import base64
import difflib
import importlib
import inspect
import json
import math
import os
import random
import re
import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CLASSES: tuple[str, ...] = ("prose", "code", "json", "cjk", "other_scripts", "mixed_turns")

MIN_BYTES = 200
MAX_BYTES = 8192


@dataclass(frozen=True)
class Sample:
    """One corpus item: either a text or a provider-facing message dict."""

    cls: str
    text: str | None = None
    message: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------
# Embedded natural sentences (written for this corpus; common vocabulary).
# ---------------------------------------------------------------------------------------

ZH_SENTENCES: tuple[str, ...] = (
    "今天的天气很好，我们一起去公园散步吧。",
    "这个函数的作用是读取配置文件并返回一个字典。",
    "请帮我检查一下代码里有没有内存泄漏的问题。",
    "我们需要在下周五之前完成这个项目的第一阶段。",
    "如果测试失败了，请先查看日志文件中的错误信息。",
    "这本书讲述了一个年轻人在大城市里奋斗的故事。",
    "数据库连接超时，可能是网络不稳定造成的。",
    "他每天早上六点起床，先跑步半个小时，然后吃早饭。",
    "为了提高系统的性能，我们决定使用缓存来减少数据库查询。",
    "中国有着悠久的历史和丰富的文化传统。",
    "用户反馈说页面加载速度太慢，需要优化前端资源。",
    "请把这个文件上传到服务器，并通知团队成员。",
    "学习一门新的编程语言需要时间和耐心。",
    "这个错误是因为变量在使用之前没有被初始化。",
    "会议将在下午三点开始，请大家准时参加。",
    "我觉得这个方案还有一些问题，需要进一步讨论。",
    "经济的快速发展给城市带来了很多变化。",
    "模型的训练结果比预期的要好，准确率提高了百分之五。",
    "你可以使用命令行工具来运行这些测试用例。",
    "春天来了，花园里的花都开了，非常漂亮。",
    "在处理大量数据的时候，应该注意内存的使用情况。",
    "这个接口返回的数据格式和文档描述的不一致。",
    "孩子们在学校里学习数学、语文和英语。",
    "我们已经修复了这个问题，新版本将在明天发布。",
    "请确认所有的依赖包都已经正确安装。",
    "他对人工智能技术的未来发展充满了信心。",
    "由于天气原因，航班推迟了两个小时。",
    "代码审查可以帮助团队发现潜在的错误。",
    "这家餐厅的菜很好吃，价格也不贵。",
    "系统会自动备份所有重要的数据。",
    "我刚才看了一下，问题出在第三行的循环条件上。",
    "“你好，”她笑着说，“好久不见了！”",
    "这座山很高，山顶上常年有积雪。",
    "根据最新的统计，今年的销售额增长了百分之十二。",
    "请不要在生产环境中直接修改配置。",
    "我建议先写单元测试，再重构这段代码。",
    "北京是中国的首都，也是一座历史文化名城。",
    "妈妈在厨房里做饭，爸爸在客厅看报纸。",
    "这个算法的时间复杂度是线性的，空间复杂度是常数。",
    "明天可能会下雨，出门记得带伞。",
)

ZH_TECH_WORDS: tuple[str, ...] = (
    "`main.py`",
    "`config.yaml`",
    "`get_messages()`",
    "API",
    "JSON",
    "HTTP 500",
    "Python 3.11",
    "`pytest`",
    "Docker",
    "`README.md`",
    "GitHub",
    "SQL",
)

JA_SENTENCES: tuple[str, ...] = (
    "今日はとても良い天気ですね。",
    "この関数は設定ファイルを読み込んで辞書を返します。",
    "テストが失敗した場合は、まずログファイルを確認してください。",
    "私たちは来週の金曜日までにこのプロジェクトを完了する必要があります。",
    "データベースへの接続がタイムアウトしました。",
    "新しいバージョンでは、パフォーマンスが大幅に改善されています。",
    "東京は日本の首都で、世界で最も人口の多い都市の一つです。",
    "このエラーは、変数が初期化される前に使用されたために発生しました。",
    "会議は午後三時から始まりますので、時間通りに参加してください。",
    "彼は毎朝六時に起きて、公園を散歩します。",
    "ユーザーからページの読み込みが遅いという報告がありました。",
    "キャッシュを使ってデータベースへの問い合わせを減らしましょう。",
    "日本の伝統的な文化には、茶道や書道などがあります。",
    "この問題はすでに修正されており、明日リリースされる予定です。",
    "必要なパッケージがすべて正しくインストールされているか確認してください。",
    "桜の季節になると、多くの人が花見に出かけます。",
    "コードレビューは、チームが潜在的なバグを見つけるのに役立ちます。",
    "私はコーヒーよりお茶のほうが好きです。",
    "大量のデータを処理するときは、メモリの使用量に注意してください。",
    "このレストランの料理はとてもおいしいです。",
    "「ありがとうございます」と彼女は言いました。",
    "もう少し詳しく説明していただけますか？",
    "駅から歩いて十分くらいのところに住んでいます。",
    "週末は家族と一緒に映画を見に行きました。",
    "このスクリプトを実行する前に、環境変数を設定してください。",
)

OTHER_SENTENCES: dict[str, tuple[str, ...]] = {
    "ru": (
        "Сегодня очень хорошая погода, давайте пойдём гулять в парк.",
        "Эта функция читает файл конфигурации и возвращает словарь.",
        "Если тест не прошёл, сначала проверьте файл журнала.",
        "Нам нужно закончить первый этап проекта до следующей пятницы.",
        "Соединение с базой данных прервано по тайм-ауту.",
        "Москва — столица России и один из крупнейших городов мира.",
        "В новой версии значительно улучшена производительность.",
        "Пожалуйста, убедитесь, что все зависимости установлены правильно.",
        "Ошибка возникла потому, что переменная не была инициализирована.",
        "Встреча начнётся в три часа дня, не опаздывайте.",
        "Пользователи жалуются, что страница загружается слишком медленно.",
        "Мы уже исправили эту проблему, новая версия выйдет завтра.",
    ),
    "uk": (
        "Будь ласка, перевірте журнал помилок перед тим, як запускати тести знову.",
        "Київ — столиця України, місто з багатою історією.",
        "Ця функція повертає список усіх файлів у каталозі.",
        "Ми плануємо випустити нову версію наступного тижня.",
    ),
    "ar": (
        "الطقس جميل جدا اليوم، دعونا نذهب إلى الحديقة.",
        "هذه الدالة تقرأ ملف الإعدادات وتعيد قاموسا.",
        "إذا فشل الاختبار، يرجى التحقق من ملف السجل أولا.",
        "نحتاج إلى إنهاء المرحلة الأولى من المشروع قبل يوم الجمعة القادم.",
        "انتهت مهلة الاتصال بقاعدة البيانات.",
        "القاهرة هي عاصمة مصر وأكبر مدينة في العالم العربي.",
        "تم تحسين الأداء بشكل كبير في الإصدار الجديد.",
        "يرجى التأكد من تثبيت جميع الحزم المطلوبة بشكل صحيح.",
    ),
    "he": (
        "מזג האוויר היום נפלא, בואו נלך לפארק.",
        "הפונקציה הזו קוראת את קובץ ההגדרות ומחזירה מילון.",
        "אם הבדיקה נכשלה, בדקו קודם את קובץ היומן.",
        "הגרסה החדשה משפרת מאוד את הביצועים.",
        "ירושלים היא עיר עתיקה וחשובה מאוד.",
    ),
    "el": (
        "Ο καιρός είναι πολύ ωραίος σήμερα, ας πάμε μια βόλτα στο πάρκο.",
        "Αυτή η συνάρτηση διαβάζει το αρχείο ρυθμίσεων και επιστρέφει ένα λεξικό.",
        "Αν η δοκιμή αποτύχει, ελέγξτε πρώτα το αρχείο καταγραφής.",
        "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
        "Η νέα έκδοση βελτιώνει σημαντικά την απόδοση.",
    ),
    "hi": (
        "आज मौसम बहुत अच्छा है, चलो पार्क में टहलने चलते हैं।",
        "यह फ़ंक्शन कॉन्फ़िगरेशन फ़ाइल पढ़ता है और एक डिक्शनरी लौटाता है।",
        "अगर टेस्ट विफल हो जाए, तो पहले लॉग फ़ाइल देखें।",
        "हमें अगले शुक्रवार तक परियोजना का पहला चरण पूरा करना है।",
        "नए संस्करण में प्रदर्शन में काफ़ी सुधार हुआ है।",
        "दिल्ली भारत की राजधानी है और यहाँ बहुत से लोग रहते हैं।",
    ),
    "th": (
        "วันนี้อากาศดีมาก ไปเดินเล่นที่สวนกันเถอะ",
        "ฟังก์ชันนี้อ่านไฟล์การตั้งค่าและคืนค่าเป็นดิกชันนารี",
        "ถ้าการทดสอบล้มเหลว กรุณาตรวจสอบไฟล์บันทึกก่อน",
        "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย",
        "เวอร์ชันใหม่ทำงานได้เร็วขึ้นมาก",
    ),
    "ko": (
        "오늘은 날씨가 정말 좋네요. 공원에 산책하러 갈까요?",
        "이 함수는 설정 파일을 읽어서 딕셔너리를 반환합니다.",
        "테스트가 실패하면 먼저 로그 파일을 확인하세요.",
        "우리는 다음 주 금요일까지 이 프로젝트를 끝내야 합니다.",
        "데이터베이스 연결 시간이 초과되었습니다.",
        "서울은 한국의 수도이며 인구가 가장 많은 도시입니다.",
        "새 버전에서는 성능이 크게 향상되었습니다.",
        "회의는 오후 세 시에 시작합니다.",
    ),
    "vi": (
        "Hôm nay thời tiết rất đẹp, chúng ta hãy đi dạo trong công viên.",
        "Hàm này đọc tệp cấu hình và trả về một từ điển.",
        "Nếu kiểm thử thất bại, hãy xem tệp nhật ký trước.",
        "Phiên bản mới cải thiện đáng kể hiệu năng.",
    ),
    "fr": (
        "Aujourd'hui, il fait très beau ; allons nous promener au parc.",
        "Cette fonction lit le fichier de configuration et renvoie un dictionnaire.",
        "Si le test échoue, vérifiez d'abord le fichier journal.",
        "La réunion commencera à quinze heures, soyez à l'heure.",
    ),
    "de": (
        "Die Verbindung zur Datenbank wurde wegen Zeitüberschreitung getrennt.",
        "Bitte überprüfen Sie zuerst die Protokolldatei, wenn der Test fehlschlägt.",
        "Wir müssen die erste Phase des Projekts bis nächsten Freitag abschließen.",
        "Die neue Version verbessert die Leistung erheblich.",
    ),
    "es": (
        "La nueva versión mejora mucho el rendimiento de la aplicación.",
        "Por favor, asegúrese de que todas las dependencias estén instaladas correctamente.",
        "El error ocurrió porque la variable no se inicializó antes de usarla.",
        "Mañana habrá una reunión a las tres de la tarde.",
    ),
}

EMOJI: tuple[str, ...] = (
    "🎉",
    "🚀",
    "✅",
    "❌",
    "👍",
    "🔥",
    "😀",
    "😅",
    "🙏",
    "❤️",
    "👨‍💻",
    "🇯🇵",
    "⚠️",
    "💡",
    "📦",
    "🐛",
)

_WORDS: tuple[str, ...] = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "cache",
    "index",
    "record",
    "session",
    "request",
    "response",
    "status",
    "error",
    "warning",
    "message",
    "result",
    "output",
    "value",
    "token",
    "budget",
    "window",
    "history",
    "user",
    "assistant",
    "tool",
    "call",
    "function",
    "module",
    "package",
    "config",
    "server",
    "client",
    "queue",
    "worker",
    "timeout",
    "retry",
    "limit",
    "offset",
    "page",
    "total",
    "items",
    "name",
    "path",
    "size",
    "modified",
    "owner",
    "group",
)

_FILE_PARTS: tuple[str, ...] = (
    "src",
    "tests",
    "docs",
    "lib",
    "core",
    "utils",
    "api",
    "models",
    "views",
    "handlers",
    "services",
    "config",
    "scripts",
    "internal",
    "pkg",
    "cmd",
    "build",
    "assets",
    "components",
    "store",
    "negotiator",
    "context",
)

_EXTS: tuple[str, ...] = (".py", ".ts", ".json", ".md", ".yaml", ".toml", ".rs", ".go", ".txt")


# ---------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------


def _target_size(rng: random.Random) -> int:
    return int(math.exp(rng.uniform(math.log(MIN_BYTES), math.log(MAX_BYTES))))


def _fill(rng: random.Random, target: int, piece: Callable[[], str], sep: str) -> str:
    parts: list[str] = []
    size = 0
    while size < target:
        p = piece()
        parts.append(p)
        size += len(p.encode("utf-8")) + len(sep)
    return sep.join(parts)


def _looks_like_prose(paragraph: str) -> bool:
    if len(paragraph) < 80 or ">>>" in paragraph or "::" in paragraph:
        return False
    lines = paragraph.splitlines()
    if any(line.startswith((" ", "\t", "|", "+", "*", "-", "=")) for line in lines):
        return False
    letters = sum(c.isalpha() or c == " " for c in paragraph)
    return letters / len(paragraph) > 0.9


_PROSE_MODULES: tuple[str, ...] = (
    "argparse",
    "asyncio",
    "collections",
    "concurrent.futures",
    "configparser",
    "contextlib",
    "dataclasses",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "functools",
    "http.client",
    "inspect",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "shutil",
    "socket",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.request",
    "zipfile",
)


def _docstrings(name: str) -> list[str]:
    mod = importlib.import_module(name)
    docs = [inspect.getdoc(mod) or ""]
    for attr in sorted(vars(mod)):
        obj = getattr(mod, attr)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(
            obj, "__module__", None
        ) == name:
            docs.append(inspect.getdoc(obj) or "")
    return docs


def prose_paragraphs() -> list[str]:
    """English paragraphs from help topics and docstrings (deterministic order)."""
    from pydoc_data import topics

    texts: list[str] = [topics.topics[k] for k in sorted(topics.topics)]
    with warnings.catch_warnings():  # deprecated aliases (typing.io) warn when read
        warnings.simplefilter("ignore")
        for name in _PROSE_MODULES:
            texts.extend(_docstrings(name))
    out: list[str] = []
    for text in texts:
        for para in text.split("\n\n"):
            para = para.strip()
            if _looks_like_prose(para):
                out.append(" ".join(para.split()) if "\n" in para and len(para) > 400 else para)
    return out


def stdlib_sources() -> list[str]:
    """Paths of the stdlib's top-level ``.py`` files, sorted."""
    root = sysconfig.get_paths()["stdlib"]
    return sorted(
        os.path.join(root, f)
        for f in os.listdir(root)
        if f.endswith(".py") and os.path.getsize(os.path.join(root, f)) > 4096
    )


class _Sources:
    def __init__(self) -> None:
        self._prose: list[str] | None = None
        self._files: list[str] | None = None
        self._file_cache: dict[str, list[str]] = {}

    @property
    def prose(self) -> list[str]:
        if self._prose is None:
            self._prose = prose_paragraphs()
        return self._prose

    def file_lines(self, rng: random.Random) -> list[str]:
        if self._files is None:
            self._files = stdlib_sources()
        path = rng.choice(self._files)
        if path not in self._file_cache:
            with open(path, encoding="utf-8", errors="replace") as f:
                self._file_cache[path] = f.read().splitlines(keepends=True)
        return self._file_cache[path]


# ---------------------------------------------------------------------------------------
# Generators per class
# ---------------------------------------------------------------------------------------


def gen_prose(rng: random.Random, src: _Sources, target: int) -> str:
    return _fill(rng, target, lambda: rng.choice(src.prose), "\n\n")


def _code_slice(rng: random.Random, src: _Sources, target: int) -> str:
    lines = src.file_lines(rng)
    start = rng.randrange(max(1, len(lines) - 20))
    out: list[str] = []
    size = 0
    for line in lines[start:]:
        out.append(line)
        size += len(line)
        if size >= target:
            break
    return "".join(out)


def _diff(rng: random.Random, src: _Sources, target: int) -> str:
    old = _code_slice(rng, src, max(MIN_BYTES, target // 2)).splitlines(keepends=True)
    new = list(old)
    for _ in range(rng.randint(1, 4)):
        if not new:  # a one-line slice whose only line was deleted
            break
        i = rng.randrange(len(new))
        choice = rng.random()
        if choice < 0.4:
            new[i] = new[i].replace("self", "ctx").replace("(", "( ", 1)
        elif choice < 0.7:
            new.insert(i, "    # TODO: " + " ".join(rng.sample(_WORDS, 5)) + "\n")
        else:
            del new[i]
    name = rng.choice(_FILE_PARTS) + "/" + rng.choice(_WORDS) + ".py"
    return "".join(difflib.unified_diff(old, new, "a/" + name, "b/" + name)) or "".join(old)


def _log(rng: random.Random, target: int) -> str:
    def line() -> str:
        kind = rng.random()
        ts = f"2025-0{rng.randint(1, 9)}-{rng.randint(10, 28)}T{rng.randint(10, 23)}:"
        ts += f"{rng.randint(10, 59)}:{rng.randint(10, 59)}.{rng.randint(100, 999)}Z"
        if kind < 0.5:
            level = rng.choice(["INFO", "DEBUG", "WARNING", "ERROR"])
            words = " ".join(rng.sample(_WORDS, rng.randint(3, 9)))
            return f"{ts} {level} [{rng.choice(_FILE_PARTS)}] {words} id={rng.getrandbits(32):08x}"
        if kind < 0.8:
            path = "/".join(rng.sample(_FILE_PARTS, 3)) + "/" + rng.choice(_WORDS) + ".py"
            fn = rng.choice(_WORDS) + "_" + rng.choice(_WORDS)
            return f'  File "/srv/app/{path}", line {rng.randint(1, 2000)}, in {fn}'
        path = "/".join(rng.sample(_FILE_PARTS, 2)) + "/" + rng.choice(_WORDS)
        return f"{path}{rng.choice(_EXTS)}:{rng.randint(1, 900)}: {rng.choice(_WORDS)} = ..."

    return _fill(rng, target, line, "\n")


_SNAKE = re.compile(r"\b([a-z]+)_([a-z0-9_]+)\b")


def _camel(match: re.Match[str]) -> str:
    head, rest = match.group(1), match.group(2)
    return head + "".join(part.capitalize() for part in rest.split("_") if part)


def _js_flavoured(rng: random.Random, src: _Sources, target: int) -> str:
    """A Python slice re-spelt the way JS/TS/Java code looks: camelCase, braces, semicolons."""
    out: list[str] = []
    for line in _code_slice(rng, src, target).splitlines():
        line = _SNAKE.sub(_camel, line).replace("self.", "this.").replace("None", "null")
        stripped = line.rstrip()
        if stripped.endswith(":"):
            line = stripped[:-1] + " {"
        elif stripped and not stripped.lstrip().startswith("#"):
            line = stripped + ";"
        out.append(line.replace("#", "//", 1))
    return "\n".join(out)


def _shell_output(rng: random.Random, target: int) -> str:
    kind = rng.random()
    if kind < 0.2:
        bar = "=" * rng.randint(20, 40)

        def line() -> str:
            mod = "tests/" + rng.choice(_FILE_PARTS) + "/test_" + rng.choice(_WORDS) + ".py"
            if rng.random() < 0.5:
                marks = "".join(rng.choices(".....F.s", k=rng.randint(5, 60)))
                return f"{mod} {marks} [{rng.randint(1, 100):3d}%]"
            fn = "test_" + rng.choice(_WORDS) + "_" + rng.choice(_WORDS)
            return f"{mod}::{fn} {rng.choice(['PASSED', 'PASSED', 'FAILED', 'SKIPPED'])}"

        body = _fill(rng, target, line, "\n")
        return f"{bar} test session starts {bar}\n{body}\n{bar} {rng.randint(1, 500)} passed in {rng.random() * 9:.2f}s {bar}"
    if kind < 0.35:

        def ls_line() -> str:
            size = rng.randint(0, 10**6)
            name = rng.choice(_WORDS) + "_" + rng.choice(_WORDS) + rng.choice(_EXTS)
            return f"-rw-r--r--  1 user staff {size:>8} Mar {rng.randint(1, 28):2d} 1{rng.randint(0, 9)}:{rng.randint(10, 59)} {name}"

        return f"total {rng.randint(8, 900)}\n" + _fill(rng, target, ls_line, "\n")
    if kind < 0.45:

        def hex_line() -> str:
            data = rng.randbytes(16)
            text = "".join(chr(c) if 32 <= c < 127 else "." for c in data)
            return f"{rng.getrandbits(24):08x}: {data.hex(' ', 2)}  {text}"

        return _fill(rng, target, hex_line, "\n")
    if kind < 0.55:

        def url_line() -> str:
            path = "/".join(rng.sample(_FILE_PARTS, rng.randint(1, 3)))
            query = f"?{rng.choice(_WORDS)}={rng.randint(1, 9999)}&page={rng.randint(1, 9)}"
            return f"GET https://api.example.com/v{rng.randint(1, 3)}/{path}{query} {rng.choice(['200', '200', '404', '500'])} {rng.randint(1, 999)}ms"

        return _fill(rng, target, url_line, "\n")
    if kind < 0.8:
        cols = rng.sample(_WORDS, rng.randint(3, 7))

        def row() -> str:
            return "| " + " | ".join(str(_scalar(rng)) for _ in cols) + " |"

        head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
        return head + _fill(rng, target, row, "\n")
    cols = rng.sample(_WORDS, rng.randint(3, 9))
    return (
        ",".join(cols)
        + "\n"
        + _fill(rng, target, lambda: ",".join(str(_scalar(rng)) for _ in cols), "\n")
    )


def _scalar(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.4:
        return rng.randint(0, 100_000)
    if r < 0.6:
        return round(rng.uniform(0, 1000), rng.randint(1, 4))
    if r < 0.8:
        return rng.choice(_WORDS)
    return f"{rng.getrandbits(32):08x}"


def _numbered(rng: random.Random, src: _Sources, target: int) -> str:
    """A file as agents' file readers return it: every line behind its number, right-aligned
    in six columns and followed by a tab (``cat -n``) or by an arrow (Claude Code's Read)."""
    lines = src.file_lines(rng)
    start = rng.randrange(max(1, len(lines) - 20))
    mark = rng.choice(["\t", "\u2192"])
    code = rng.random() < 0.4
    out: list[str] = []
    size = 0
    for number, line in enumerate(lines[start:], start + 1):
        if code:
            line = _SNAKE.sub(_camel, line)
        out.append(f"{number:6d}{mark}{line}")
        size += len(out[-1])
        if size >= target:
            break
    return "".join(out)


def gen_code(rng: random.Random, src: _Sources, target: int) -> str:
    r = rng.random()
    if r < 0.45:
        return _code_slice(rng, src, target)
    if r < 0.6:
        return _js_flavoured(rng, src, target)
    if r < 0.7:
        return _diff(rng, src, target)
    if r < 0.8:
        return _log(rng, target)
    return _shell_output(rng, target)


def _json_value(rng: random.Random, prose: list[str], depth: int) -> Any:
    r = rng.random()
    if depth < 3 and r < 0.15:
        n = rng.randint(1, 5)
        return {rng.choice(_WORDS): _json_value(rng, prose, depth + 1) for _ in range(n)}
    if depth < 3 and r < 0.25:
        return [_json_value(rng, prose, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.4:
        return rng.randint(-5, 100_000)
    if r < 0.48:
        return round(rng.uniform(0, 1000), rng.randint(1, 6))
    if r < 0.54:
        return rng.choice([True, False, None])
    if r < 0.6:
        return f"{rng.getrandbits(128):032x}"
    if r < 0.62:
        return base64.b64encode(rng.randbytes(rng.randint(12, 300))).decode()
    if r < 0.72:
        return "/".join(rng.sample(_FILE_PARTS, rng.randint(1, 4))) + rng.choice(_EXTS)
    if r < 0.8:
        return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:{rng.randint(10, 59)}Z"
    if r < 0.9:
        return rng.choice(prose)[: rng.randint(20, 200)]
    return " ".join(rng.sample(_WORDS, rng.randint(1, 6)))


def _json_record(rng: random.Random, prose: list[str]) -> dict[str, Any]:
    shape = rng.random()
    if shape < 0.3:
        return {
            "path": "/".join(rng.sample(_FILE_PARTS, rng.randint(1, 4)))
            + "/"
            + rng.choice(_WORDS)
            + rng.choice(_EXTS),
            "type": rng.choice(["file", "dir", "symlink"]),
            "size": rng.randint(0, 10**6),
            "modified": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T0"
            f"{rng.randint(0, 9)}:{rng.randint(10, 59)}:00Z",
        }
    if shape < 0.55:
        return {
            "file": "/".join(rng.sample(_FILE_PARTS, 2)) + "/" + rng.choice(_WORDS) + ".py",
            "line": rng.randint(1, 3000),
            "match": " ".join(rng.sample(_WORDS, rng.randint(2, 8))),
            "score": round(rng.random(), 4),
        }
    if shape < 0.8:
        keys = rng.sample(_WORDS, rng.randint(1, 5))
        return {
            "id": f"{rng.getrandbits(64):016x}",
            "name": rng.choice(_WORDS) + "_" + rng.choice(_WORDS),
            "status": rng.choice(["ok", "failed", "pending", "skipped"]),
            "attributes": {k: _json_value(rng, prose, 2) for k in keys},
        }
    return {k: _json_value(rng, prose, 1) for k in rng.sample(_WORDS, rng.randint(2, 7))}


def _arguments_json(rng: random.Random, src: _Sources, target: int) -> str:
    """A tool call's arguments as the JSON string a model writes: file contents, edits and
    commands inside string values, so newlines, quotes and tabs appear escapes (``\\n``)."""
    path = "/".join(rng.sample(_FILE_PARTS, rng.randint(2, 5))) + "/" + rng.choice(_WORDS)
    path = rng.choice(["/home/user/project/", "/Users/dev/work/", ""]) + path + rng.choice(_EXTS)
    body = _code_slice(rng, src, target) if rng.random() < 0.7 else gen_prose(rng, src, target)
    shape = rng.random()
    if shape < 0.4:
        args: dict[str, Any] = {"file_path": path, "content": body}
    elif shape < 0.8:
        half = len(body) // 2
        args = {
            "replace_all": False,
            "file_path": path,
            "old_string": body[:half],
            "new_string": body[half:],
        }
    else:
        args = {"description": rng.choice(src.prose)[:80], "prompt": body}
    return json.dumps(args, ensure_ascii=False)


def gen_json(rng: random.Random, src: _Sources, target: int) -> str:
    prose = src.prose
    indent = rng.choice([None, None, 2, 2, 4])
    separators = (",", ":") if indent is None and rng.random() < 0.3 else None
    records: list[dict[str, Any]] = []
    size = 0
    while size < target:
        rec = _json_record(rng, prose)
        records.append(rec)
        size += len(json.dumps(rec, indent=indent)) + 2
    doc: Any = records
    if rng.random() < 0.5:
        doc = {"results": records, "total": len(records), "truncated": rng.random() < 0.3}
    return json.dumps(doc, indent=indent, separators=separators, ensure_ascii=rng.random() < 0.2)


def gen_cjk(rng: random.Random, src: _Sources, target: int) -> str:
    sentences = ZH_SENTENCES if rng.random() < 0.6 else JA_SENTENCES
    tech = rng.random() < 0.3

    def piece() -> str:
        s = rng.choice(sentences)
        if tech and rng.random() < 0.3:
            cut = max(s.find("，"), s.find("、")) + 1
            s = s[:cut] + " " + rng.choice(ZH_TECH_WORDS) + " " + s[cut:]
        if rng.random() < 0.15:
            s += "\n\n"
        return s

    return _fill(rng, target, piece, "")


def gen_other(rng: random.Random, src: _Sources, target: int) -> str:
    lang = rng.choice(sorted(OTHER_SENTENCES))
    sentences = OTHER_SENTENCES[lang]
    emoji = rng.random() < 0.3

    def piece() -> str:
        s = rng.choice(sentences)
        if emoji and rng.random() < 0.4:
            s += " " + "".join(rng.choices(EMOJI, k=rng.randint(1, 3)))
        if rng.random() < 0.1:
            s += "\n"
        return s

    if rng.random() < 0.05:
        return _fill(rng, target, lambda: " ".join(rng.choices(EMOJI, k=rng.randint(1, 5))), " ")
    return _fill(rng, target, piece, " ")


_TEXT_GENERATORS: dict[str, Callable[[random.Random, _Sources, int], str]] = {
    "prose": gen_prose,
    "code": gen_code,
    "json": gen_json,
    "cjk": gen_cjk,
    "other_scripts": gen_other,
}
"""Tool-result and prompt text by class; the benchmark histories are built from these."""


def gen_session_code(rng: random.Random, src: _Sources, target: int) -> str:
    """``gen_code``, or (one sample in six) a line-numbered file read."""
    if rng.random() < 1 / 6:
        return _numbered(rng, src, target)
    return gen_code(rng, src, target)


def gen_session_json(rng: random.Random, src: _Sources, target: int) -> str:
    """``gen_json``, or (one sample in four) a tool call's arguments."""
    if rng.random() < 0.25:
        return _arguments_json(rng, src, target)
    return gen_json(rng, src, target)


_CORPUS_GENERATORS: dict[str, Callable[[random.Random, _Sources, int], str]] = {
    **_TEXT_GENERATORS,
    "code": gen_session_code,
    "json": gen_session_json,
}
"""The calibration corpus's text classes: ``_TEXT_GENERATORS`` plus what agent sessions
carry besides tool output - file reads with line numbers, tool-call arguments with
escaped file contents. Kept apart so that the benchmark histories (``histories.py``)
stay the workload they were."""


def _call_id(rng: random.Random) -> str:
    return "call_" + "".join(
        rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789", k=24)
    )


def _tool_args(rng: random.Random, src: _Sources) -> dict[str, Any]:
    r = rng.random()
    if r < 0.3:
        return {"command": "grep -rn '" + rng.choice(_WORDS) + "' " + rng.choice(_FILE_PARTS)}
    if r < 0.55:
        return {
            "file_path": "/".join(rng.sample(_FILE_PARTS, 3)) + "/" + rng.choice(_WORDS) + ".py"
        }
    if r < 0.8:
        return {
            "file_path": rng.choice(_FILE_PARTS) + "/" + rng.choice(_WORDS) + ".py",
            "old_string": _code_slice(rng, src, rng.randint(40, 400)),
            "new_string": _code_slice(rng, src, rng.randint(40, 400)),
        }
    return {"query": rng.choice(ZH_SENTENCES + JA_SENTENCES), "limit": rng.randint(1, 50)}


def _text_for_turn(rng: random.Random, src: _Sources, small: bool) -> str:
    cls = rng.choices(["prose", "code", "json", "cjk", "other_scripts"], [4, 3, 3, 2, 1])[0]
    target = rng.randint(60, 600) if small else _target_size(rng)
    return _TEXT_GENERATORS[cls](rng, src, target)


def gen_message(rng: random.Random, src: _Sources) -> dict[str, Any]:
    """One provider-facing message, in one of the shapes the ecosystem uses."""
    style = rng.choice(["openai", "anthropic", "amplifier"])
    role = rng.choices(["user", "assistant", "tool"], [2, 3, 3])[0]
    metadata = {"timestamp": "2025-01-01T00:00:00.000Z", "source": "x" * rng.randint(0, 500)}
    if role == "user":
        if style == "anthropic" and rng.random() < 0.5:
            blocks = [
                {"type": "text", "text": _text_for_turn(rng, src, small=False)}
                for _ in range(rng.randint(1, 2))
            ]
            return {"role": "user", "content": blocks, "metadata": metadata}
        return {"role": "user", "content": _text_for_turn(rng, src, False), "metadata": metadata}
    if role == "assistant":
        n = rng.randint(1, 3)
        text = _text_for_turn(rng, src, small=True) if rng.random() < 0.7 else ""
        if style == "anthropic":
            content: list[dict[str, Any]] = []
            if text:
                content.append({"type": "text", "text": text})
            content.extend(
                {
                    "type": "tool_use",
                    "id": "toolu_" + _call_id(rng)[5:],
                    "name": rng.choice(["bash", "read_file", "edit_file", "grep"]),
                    "input": _tool_args(rng, src),
                }
                for _ in range(n)
            )
            return {"role": "assistant", "content": content, "metadata": metadata}
        if style == "openai":
            calls: list[dict[str, Any]] = [
                {
                    "id": _call_id(rng),
                    "type": "function",
                    "function": {
                        "name": rng.choice(["bash", "read_file", "edit_file", "grep"]),
                        "arguments": json.dumps(_tool_args(rng, src)),
                    },
                }
                for _ in range(n)
            ]
        else:
            calls = [
                {
                    "id": _call_id(rng),
                    "tool": rng.choice(["bash", "read_file", "edit_file", "grep"]),
                    "arguments": _tool_args(rng, src),
                }
                for _ in range(n)
            ]
        return {"role": "assistant", "content": text, "tool_calls": calls, "metadata": metadata}
    result = _text_for_turn(rng, src, small=False)
    if style == "anthropic":
        inner: Any = result if rng.random() < 0.5 else [{"type": "text", "text": result}]
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": inner}],
            "metadata": metadata,
        }
    return {
        "role": "tool",
        "tool_call_id": _call_id(rng),
        "name": rng.choice(["bash", "read_file"]),
        "content": result,
        "metadata": metadata,
    }


def build_corpus(seed: int = 20250101, per_class: int = 120) -> list[Sample]:
    """The calibration corpus: ``per_class`` samples of every class in ``CLASSES``."""
    src = _Sources()
    out: list[Sample] = []
    for index, cls in enumerate(CLASSES):
        rng = random.Random(seed * 31 + index)
        for _ in range(per_class):
            if cls == "mixed_turns":
                out.append(Sample(cls, message=gen_message(rng, src)))
            else:
                target = _target_size(rng)
                out.append(Sample(cls, text=_CORPUS_GENERATORS[cls](rng, src, target)))
    return out
