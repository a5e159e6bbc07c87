"""The ETL a Spark user writes today, timed beside ours by ``benchmarks/etl_bench.py`` (``--peers``).

* ``binaryfile``: Spark's ``binaryFile`` source (recursive), the class from the folder name
  (``NNN.name``: label ``NNN - 1``, as ours), a vectorised pandas UDF (``@pandas_udf``, a pandas
  Series of file bytes in, a DataFrame of image, height, width out) that decodes with Pillow,
  shrinks to fit the square (``Image.thumbnail``, LANCZOS, which lets Pillow decode a JPEG at a
  reduced scale first, as ours does) and pastes it centred on white (our rows' pixels), and one
  Parquet write of everything; Spark plans the partitions itself (no repartition).
* ``image``: Spark's ``image`` source, which decodes the files in the JVM with Java's ImageIO
  (:data:`IMAGE_SOURCE_FORMATS`) into full-size BGR rows (``dropInvalid``: undecodable files
  dropped), then the same pandas UDF from those pixels (no reduced-scale decode: the JVM already
  decoded every pixel), and one write. Its rows travel to Python decoded, so the Arrow batches are
  cut to :data:`IMAGE_ARROW_ROWS` rows (Spark's default of 10,000 rows a batch would hold a whole
  partition of decoded photos).

Both write the columns of ours but for the row-group layout (Spark's defaults), from the same
files, at the same size, and need nothing beyond PySpark, pandas, pyarrow and Pillow (both stacks
have them: no install).
"""

import io
from typing import Callable, Dict, Tuple

PEERS = ("binaryfile", "image")
# Java 17's ImageIO readers (javax.imageio): no WebP; Spark's image source also drops what ImageIO
# returns no image for (a CMYK JPEG, for one).
IMAGE_SOURCE_FORMATS = "JPEG, PNG, GIF, BMP, WBMP, TIFF (Java ImageIO: no WebP)"
IMAGE_ARROW_ROWS = 64
ARROW_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
OUTPUT_DDL = "image BINARY, height INT, width INT"
LABELS = (r"([^/]+)/[^/]+$", r"^(\d+)\.(.*)$")  # the class folder of a path; its NNN and name (NNN.name)


def pick_peers(flag: str) -> Tuple[str, ...]:
    """The peers ``--peers`` names (comma-separated, each once, in the order given); ``"none"``
    runs none.

    Raises:
        pipelines.runtime.errors.Refused: an unknown name or an empty list; the message lists the names.
    """
    from pipelines.runtime.errors import Refused

    wanted = [x.strip() for x in flag.split(",") if x.strip()]
    if wanted == ["none"]:
        return ()
    unknown = [x for x in wanted if x not in PEERS]
    choose = f"choose from {', '.join(PEERS)} (or none)"
    if not wanted:
        raise Refused(f"--peers names no peer; {choose}")
    if unknown:
        raise Refused(f"--peers {flag}: unknown {', '.join(unknown)}; {choose}")
    return tuple(dict.fromkeys(wanted))


def fit_on_white(image, size: int) -> Tuple[bytes, int, int]:
    """A Pillow image shrunk to fit ``size x size`` (``thumbnail``, LANCZOS) and pasted centred on a
    white RGB square: ``(size * size * 3 bytes, original height, original width)``."""
    from PIL import Image

    width, height = image.size
    image.thumbnail((size, size), Image.Resampling.LANCZOS)
    image = image.convert("RGB")
    canvas = Image.new("RGB", (size, size), (255, 255, 255))
    canvas.paste(image, ((size - image.size[0]) // 2, (size - image.size[1]) // 2))
    return canvas.tobytes(), height, width


def _labelled(frame):
    """``frame`` with ``label`` (``NNN - 1``) and ``label_name`` (``name``) from the class folder
    ``NNN.name`` of its ``path``, as ours."""
    from pyspark.sql import functions as F

    folder = F.regexp_extract("path", LABELS[0], 1)
    return frame.withColumn("label_name", F.regexp_extract(folder, LABELS[1], 2)).withColumn(
        "label", (F.regexp_extract(folder, LABELS[1], 1).cast("int") - 1))


def binaryfile_job(spark, input_dir: str, output_dir: str, size: int) -> int:
    """The ``binaryfile`` peer (see the module); returns the rows written."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from PIL import Image

    @pandas_udf(OUTPUT_DDL)
    def resize(content: pd.Series) -> pd.DataFrame:
        rows = [fit_on_white(Image.open(io.BytesIO(data)), size) for data in content]
        return pd.DataFrame(rows, columns=["image", "height", "width"])

    files = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(input_dir)
    out = _labelled(files).select("path", "label", "label_name", resize("content").alias("r"))
    out.select("path", "label", "label_name", "r.image", "r.height", "r.width").write.mode("overwrite") \
        .parquet(output_dir)
    return spark.read.parquet(output_dir).count()


def image_source_job(spark, input_dir: str, output_dir: str, size: int) -> int:
    """The ``image`` peer (see the module); returns the rows written."""
    import numpy as np
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf
    from PIL import Image

    @pandas_udf(OUTPUT_DDL)
    def resize(data: pd.Series, height: pd.Series, width: pd.Series, channels: pd.Series) -> pd.DataFrame:
        rows = []
        for pixels, h, w, c in zip(data, height, width, channels):
            bgr = np.frombuffer(pixels, np.uint8).reshape(h, w, c)
            rgb = bgr[:, :, 0] if c == 1 else bgr[:, :, 2::-1]  # BGR(A) -> RGB, alpha dropped
            rows.append(fit_on_white(Image.fromarray(np.ascontiguousarray(rgb)), size))
        return pd.DataFrame(rows, columns=["image", "height", "width"])

    images = (spark.read.format("image").option("dropInvalid", "true").option("recursiveFileLookup", "true")
              .load(input_dir).select(F.col("image.origin").alias("path"), "image.data", "image.height",
                                      "image.width", "image.nChannels"))
    out = _labelled(images).select("path", "label", "label_name",
                                   resize("data", "height", "width", "nChannels").alias("r"))
    before = spark.conf.get(ARROW_RECORDS)
    spark.conf.set(ARROW_RECORDS, str(IMAGE_ARROW_ROWS))
    try:
        out.select("path", "label", "label_name", "r.image", "r.height", "r.width").write.mode("overwrite") \
            .parquet(output_dir)
    finally:
        spark.conf.set(ARROW_RECORDS, before)
    return spark.read.parquet(output_dir).count()


JOBS: Dict[str, Callable] = {"binaryfile": binaryfile_job, "image": image_source_job}
NAMES = {"binaryfile": "binaryFile + pandas UDF", "image": "image source + pandas UDF"}
