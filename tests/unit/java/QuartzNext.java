import java.io.*;
import java.util.*;
import org.quartz.CronExpression;

/** Reads "expression TAB zone TAB after-ms TAB count" lines; answers "ok t1 t2 ..." (ms) or "err why". */
public class QuartzNext {
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        PrintWriter out = new PrintWriter(new BufferedWriter(new OutputStreamWriter(System.out, "UTF-8")));
        out.println("max-year " + (Calendar.getInstance().get(Calendar.YEAR) + 100));
        out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) { out.flush(); continue; }
            String[] f = line.split("\t");
            StringBuilder answer = new StringBuilder("ok");
            try {
                CronExpression e = new CronExpression(f[0]);
                e.setTimeZone(TimeZone.getTimeZone(f[1]));
                Date t = new Date(Long.parseLong(f[2]));
                for (int i = Integer.parseInt(f[3]); i > 0; i--) {
                    t = e.getNextValidTimeAfter(t);
                    if (t == null) break;
                    answer.append(' ').append(t.getTime());
                }
            } catch (Exception ex) {
                answer = new StringBuilder("err " + ex.toString().replace('\n', ' '));
            }
            out.println(answer);
        }
        out.flush();
    }
}
