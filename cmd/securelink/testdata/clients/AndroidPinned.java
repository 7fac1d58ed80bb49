// What the Hermes Android app does on a pinned Secure Link route, on a JVM
// with OkHttp. It mirrors Codename-11/hermes-relay
// app/src/main/kotlin/com/hermesandroid/relay/network/shared/PluginProxyTransport.kt
// (read for behaviour, not copied):
//   - buildPluginProxyClient (lines 73-117): an SSLContext over
//     PinnedOrSystemTrustManager, sslSocketFactory(factory, thatTrustManager)
//     and CertificatePinner.Builder().add(host, pin);
//   - systemTrustManager (119-123): the platform's default TrustManagerFactory;
//   - PinnedOrSystemTrustManager (125-149): system trust first, else the
//     leaf's SPKI pin; getAcceptedIssuers returns the system's issuers, which
//     OkHttp's chain cleaner builds the chain against before CertificatePinner
//     checks the pin.
// Usage: java -cp okhttp.jar:okio.jar AndroidPinned.java https://HOST:PORT/relay/health sha256/PIN
// Prints one JSON line {"ok":bool,"stage":...,"error":...}.
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.security.cert.CertificateException;
import java.security.cert.X509Certificate;
import java.util.Base64;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509TrustManager;
import okhttp3.CertificatePinner;
import okhttp3.OkHttpClient;
import okhttp3.Request;
import okhttp3.Response;

public class AndroidPinned {
    static final class PinnedOrSystem implements X509TrustManager {
        private final X509TrustManager system;
        private final String pin;

        PinnedOrSystem(X509TrustManager system, String pin) {
            this.system = system;
            this.pin = pin;
        }

        public void checkClientTrusted(X509Certificate[] chain, String authType) throws CertificateException {
            system.checkClientTrusted(chain, authType);
        }

        public void checkServerTrusted(X509Certificate[] chain, String authType) throws CertificateException {
            if (chain == null || chain.length == 0) throw new CertificateException("no certificate chain");
            try {
                system.checkServerTrusted(chain, authType);
                return;
            } catch (CertificateException e) {
                // fall through to the pin
            }
            X509Certificate leaf = chain[0];
            leaf.checkValidity();
            String actual;
            try {
                actual = "sha256/" + Base64.getEncoder().encodeToString(
                    MessageDigest.getInstance("SHA-256").digest(leaf.getPublicKey().getEncoded()));
            } catch (Exception e) {
                throw new CertificateException(e);
            }
            if (!MessageDigest.isEqual(actual.getBytes(), pin.getBytes())) {
                throw new CertificateException("certificate does not match the paired pin");
            }
        }

        public X509Certificate[] getAcceptedIssuers() {
            return system.getAcceptedIssuers();
        }
    }

    static String json(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    public static void main(String[] args) throws Exception {
        String url = args[0], pin = args[1];
        TrustManagerFactory f = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        f.init((KeyStore) null);
        X509TrustManager system = null;
        for (TrustManager tm : f.getTrustManagers()) if (tm instanceof X509TrustManager) system = (X509TrustManager) tm;
        PinnedOrSystem trust = new PinnedOrSystem(system, pin);
        SSLContext ctx = SSLContext.getInstance("TLS");
        ctx.init(null, new TrustManager[] {trust}, new SecureRandom());
        String host = okhttp3.HttpUrl.get(url).host();
        OkHttpClient client = new OkHttpClient.Builder()
            .sslSocketFactory(ctx.getSocketFactory(), trust)
            .certificatePinner(new CertificatePinner.Builder().add(host, pin).build())
            .connectTimeout(10, TimeUnit.SECONDS)
            .readTimeout(10, TimeUnit.SECONDS)
            .build();
        try (Response r = client.newCall(new Request.Builder().url(url).build()).execute()) {
            boolean ok = r.code() == 200;
            System.out.println("{\"ok\":" + ok + ",\"stage\":\"http\",\"runtime\":" + json(okhttp3.internal.Version.userAgent() + " on java " + System.getProperty("java.version"))
                + (ok ? "" : ",\"error\":" + json("HTTP " + r.code())) + "}");
            System.exit(ok ? 0 : 1);
        } catch (Exception e) {
            System.out.println("{\"ok\":false,\"stage\":\"tls\",\"runtime\":" + json(okhttp3.internal.Version.userAgent() + " on java " + System.getProperty("java.version"))
                + ",\"error\":" + json(e.getClass().getName() + ": " + e.getMessage()) + "}");
            System.exit(1);
        }
    }
}
