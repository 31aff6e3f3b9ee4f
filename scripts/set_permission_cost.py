import time, tempfile, resource, os
from fogshift.runtime.session import build_session
d = tempfile.mkdtemp()
spark = build_session("x", "local[1]", d + "/local")
jvm = spark._jvm
conf = spark._jsc.hadoopConfiguration()
P = jvm.org.apache.hadoop.fs.Path
perm = jvm.org.apache.hadoop.fs.permission.FsPermission(0o644)
for name, fs in (("hadoop", jvm.org.apache.hadoop.fs.RawLocalFileSystem()), ("nio", jvm.fogshift.hadoop.NioLocalFileSystem.Raw())):
    fs.initialize(jvm.java.net.URI("file:///"), conf)
    p = P(d + "/f-" + name); fs.create(p, True).close()
    for _ in range(20): fs.setPermission(p, perm)
    def busy():
        with open("/proc/stat") as f: v = f.readline().split()[1:8]
        return sum(int(x) for x in v[:3]) + int(v[5]) + int(v[6])
    b0 = busy(); t0 = time.perf_counter()
    n = 300
    for _ in range(n): fs.setPermission(p, perm)
    dt = time.perf_counter() - t0; db = (busy() - b0) / os.sysconf("SC_CLK_TCK")
    print(f"{name}: {1000*dt/n:.2f} ms wall, {1000*db/n:.2f} ms machine CPU per setPermission")
spark.stop()
