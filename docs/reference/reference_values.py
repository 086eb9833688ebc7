# Reference values for the loss and optimizer unit tests, from the plain
# formulas (no framework). Run: python3 docs/reference/reference_values.py
# The printed numbers are pasted into harness/src/losses.rs and
# harness/src/optim/tests.rs next to the formula each one checks.
import math
z=[[1.0,2.0,0.5],[-1.0,0.0,3.0]]
N,C=2,3
onehot=[[0,1,0],[0,0,1]]
vals=[[0.5,-1,2],[0,1,-0.5]]
counts=[[0,2,1],[3,0,1]]
dist=[[0.2,0.5,0.3],[0.1,0.1,0.8]]
binary=[[0,1,0],[1,0,1]]
sig=lambda x:1/(1+math.exp(-x))
def softmax(r):
    m=max(r); e=[math.exp(v-m) for v in r]; s=sum(e); return [v/s for v in e]
def ce(t,ls=0.0):
    L=0; G=[]
    for r,tr in zip(z,t):
        p=softmax(r); tt=[(1-ls)*v+ls/C for v in tr]
        L+=-sum(a*math.log(b) for a,b in zip(tt,p))
        G.append([(pi-ti)/N for pi,ti in zip(p,tt)])
    return L/N,G
def mse(t):
    n=N*C; L=sum((a-b)**2 for r,tr in zip(z,t) for a,b in zip(r,tr))/n
    G=[[2*(a-b)/n for a,b in zip(r,tr)] for r,tr in zip(z,t)]; return L,G
def rmse(t,eps):
    L,G=mse(t); R=math.sqrt(L+eps); return R,[[g/(2*R) for g in r] for r in G]
def huber(t,d):
    n=N*C; L=0; G=[]
    for r,tr in zip(z,t):
        g=[]
        for a,b in zip(r,tr):
            e=a-b
            if abs(e)<=d: L+=0.5*e*e; g.append(e/n)
            else: L+=d*(abs(e)-0.5*d); g.append(d*math.copysign(1,e)/n)
        G.append(g)
    return L/n,G
def bce(t):
    n=N*C; L=0;G=[]
    for r,tr in zip(z,t):
        g=[]
        for a,b in zip(r,tr):
            p=sig(a); L+=-(b*math.log(p)+(1-b)*math.log(1-p)); g.append((p-b)/n)
        G.append(g)
    return L/n,G
def kl(t):
    L=0;G=[]
    for r,tr in zip(z,t):
        p=softmax(r); L+=sum(a*(math.log(a)-math.log(b)) for a,b in zip(tr,p))
        G.append([(pi-ti)/N for pi,ti in zip(p,tr)])
    return L/N,G
def poisson_log(t):
    n=N*C; L=sum(math.exp(a)-b*a for r,tr in zip(z,t) for a,b in zip(r,tr))/n
    G=[[(math.exp(a)-b)/n for a,b in zip(r,tr)] for r,tr in zip(z,t)]; return L,G
def poisson_lin(t,eps,zz):
    n=N*C; L=sum(a-b*math.log(a+eps) for r,tr in zip(zz,t) for a,b in zip(r,tr))/n
    G=[[(1-b/(a+eps))/n for a,b in zip(r,tr)] for r,tr in zip(zz,t)]; return L,G
def log1m(t):
    n=N*C; L=sum(math.log(1-sig(a))*b for r,tr in zip(z,t) for a,b in zip(r,tr))/n
    G=[[-sig(a)*b/n for a,b in zip(r,tr)] for r,tr in zip(z,t)]; return L,G
def fmt(name,LG):
    L,G=LG; print(f"{name}: {L!r}\n  grad {[[float(f'{v:.17g}') for v in r] for r in G]}")
fmt("ce",ce(onehot)); fmt("ce_ls0.1",ce(onehot,0.1)); fmt("mse",mse(vals)); fmt("rmse",rmse(vals,1e-6))
fmt("huber1",huber(vals,1.0)); fmt("bce",bce(binary)); fmt("kl",kl(dist)); fmt("poisson_log",poisson_log(counts))
zp=[[abs(v)+0.5 for v in r] for r in z]; print("zp",zp); fmt("poisson_lin",poisson_lin(counts,1e-8,zp)); fmt("log1m",log1m(binary))
# optimizers: scalar p0=1.0 grads [0.5,-0.25,1.0]
gs=[0.5,-0.25,1.0]
def sgd(lr,mom,nest,wd):
    p=1.0;buf=None;out=[]
    for g in gs:
        g=g+wd*p
        if mom>0:
            buf=g if buf is None else mom*buf+g
            d=g+mom*buf if nest else buf
        else: d=g
        p-=lr*d; out.append(p)
    return out
def adam(lr,b1,b2,eps,wd,decoupled):
    p=1.0;m=0;v=0;out=[]
    for t,g in enumerate(gs,1):
        if decoupled: p*=1-lr*wd
        else: g=g+wd*p
        m=b1*m+(1-b1)*g; v=b2*v+(1-b2)*g*g
        bc1=1-b1**t; bc2=1-b2**t
        p-= (lr/bc1)*m/(math.sqrt(v)/math.sqrt(bc2)+eps); out.append(p)
    return out
def rms(lr,a,eps,mom,wd):
    p=1.0;v=0;buf=None;out=[]
    for g in gs:
        g=g+wd*p; v=a*v+(1-a)*g*g; avg=math.sqrt(v)+eps
        if mom>0:
            buf=g/avg if buf is None else mom*buf+g/avg; p-=lr*buf
        else: p-=lr*g/avg
        out.append(p)
    return out
print("sgd", sgd(0.1,0,False,0)); print("sgd_mom", sgd(0.1,0.9,False,0.01)); print("sgd_nest", sgd(0.1,0.9,True,0))
print("adam", adam(0.1,0.9,0.999,1e-8,0.01,False)); print("adamw", adam(0.1,0.9,0.999,1e-8,0.1,True)); print("rmsprop", rms(0.01,0.99,1e-8,0,0)); print("rmsprop_mom", rms(0.01,0.99,1e-8,0.9,0.01))
